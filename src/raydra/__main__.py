"""`python -m raydra ...` is the `raydra` command."""

from raydra.cli import main

raise SystemExit(main())
