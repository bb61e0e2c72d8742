"""Every reach into another library's private API, and nowhere else: one module per library.

Each function leans on something a library does not document, because no public API does the job
(each says why). tests/private_apis/test_private_apis.py pins the behaviour raydra relies on, so an upgrade that
moves one fails there in seconds rather than in a slow end-to-end test, and pyproject.toml caps
those libraries at the minor versions tested: an upgrade is a decision, made by running that test
file. Imports are inside the functions: the driver, the workers and `raydra compare` each load only
the libraries they use.
"""
