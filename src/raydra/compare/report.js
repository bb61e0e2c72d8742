// raydra compare's report: reshapes the data raydra wrote into this page and hands it to plotly.
// No chart drawing of its own, and nothing fetched.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("data").textContent);
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  // Plotly reads its titles, names, labels and hover texts as a little HTML (<a href>, <b>, <br>):
  // what a run recorded goes in as text, its markup escaped (Plotly shows &lt; as <).
  const plain = (s) => String(s).replace(/[&<>]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;" })[c]);
  const plainValue = (v) => (typeof v === "string" ? plain(v) : v);
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const color = (i) => COLORS[i % COLORS.length];
  const FAST = D.runs.length > 200; // many runs: WebGL lines, no markers

  // The runs table, sortable by clicking a header (numbers as numbers, blanks last).
  let order = D.table.map((_, i) => i), sortCol = -1, sortDir = 1;
  function drawTable() {
    const head = "<thead><tr>" + D.columns.map((c, j) => `<th data-col="${j}" class="${j === sortCol ? (sortDir > 0 ? "asc" : "desc") : ""}">${esc(c)}</th>`).join("") + "</tr></thead>";
    const body = order.map((i) => "<tr>" + D.table[i].map((cell, j) => {
      const cls = D.columns[j] === "status" ? "status " + D.runs[i].cls : D.numeric[j] ? "num" : "";
      const text = D.columns[j] === "run" ? `<a href="#run-${i}">${esc(cell[0])}</a>` : esc(cell[0]);
      return `<td class="${cls}">${text}</td>`;
    }).join("") + "</tr>").join("");
    $("runs").innerHTML = head + "<tbody>" + body + "</tbody>";
  }
  $("runs").addEventListener("click", (ev) => {
    const th = ev.target.closest("th");
    if (!th) return;
    const j = +th.dataset.col;
    sortDir = j === sortCol ? -sortDir : 1;
    sortCol = j;
    const key = (i) => (D.numeric[j] ? D.table[i][j][1] : D.table[i][j][0]);
    order.sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === null || x === "") return 1;
      if (y === null || y === "") return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * sortDir;
    });
    drawTable();
  });
  drawTable();

  // Curves.
  function smooth(ys, a) {
    if (!a) return ys;
    let last = null;
    return ys.map((y) => (last = last === null ? y : a * last + (1 - a) * y));
  }
  function points(c, x) {
    // Per-step metrics are logged many times an epoch: against epoch, one point per epoch (the mean).
    const pairs = c.y.map((y, k) => [c[x][k], y]).filter((p) => p[0] !== null);
    if (x !== "epoch") return pairs;
    const by = new Map();
    pairs.forEach(([e, y]) => by.set(e, (by.get(e) || []).concat([y])));
    return [...by.entries()].sort((p, q) => p[0] - q[0]).map(([e, ys]) => [e, ys.reduce((s, v) => s + v, 0) / ys.length]);
  }
  // One plot per metric, in the order raydra chose (D.plots: the monitored metric first, raydra's
  // diagnostics last, under their own heading); a metric with one point per run is a bar per run.
  const plotDivs = {};
  function plotDiv(plot, m) {
    let div = plotDivs[plot.metric];
    if (!div) {
      if (plot.diagnostic && !$("diagnostics-heading")) {
        const h = document.createElement("h3");
        h.id = "diagnostics-heading";
        h.textContent = "raydra's diagnostics: throughput, step time, data wait, MFU, workers";
        $("curves").appendChild(h);
      }
      div = plotDivs[plot.metric] = document.createElement("div");
      div.className = "plot" + (plot.bar ? " bars" : "");
      div.id = "curve-" + m;
      div.dataset.metric = plot.metric;
      $("curves").appendChild(div);
    }
    return div;
  }
  function meanSd(ys) {
    const mean = ys.reduce((s, y) => s + y, 0) / ys.length;
    return [mean, ys.length < 2 ? 0 : Math.sqrt(ys.reduce((s, y) => s + (y - mean) ** 2, 0) / (ys.length - 1))];
  }
  function barTraces(curves, grouped) {
    // One trace per run (or group), so the legend hides bars as it hides curves, in the same colours.
    if (!grouped) {
      return curves.map((c) => ({ type: "bar", name: plain(D.runs[c.run].label), x: [plain(D.runs[c.run].label)], y: [c.y[c.y.length - 1]],
        marker: { color: color(c.run) }, hovertemplate: "%{x}: %{y}<extra></extra>" }));
    }
    return D.groups.map((g, gi) => {
      const ys = curves.filter((c) => g.runs.includes(c.run)).map((c) => c.y[c.y.length - 1]);
      if (!ys.length) return null;
      const [mean, sd] = meanSd(ys), name = plain(`${g.label} (n=${ys.length})`);
      return { type: "bar", name, x: [name], y: [mean], error_y: { type: "data", array: [sd], visible: ys.length > 1 }, marker: { color: color(gi) } };
    }).filter((t) => t);
  }
  function lineTraces(curves, grouped, x, a) {
    const traces = [];
    if (!grouped) {
      curves.forEach((c) => {
        const p = points(c, x);
        traces.push({ type: FAST ? "scattergl" : "scatter", mode: p.length < 3 ? "lines+markers" : "lines", name: plain(D.runs[c.run].label),
          x: p.map((q) => q[0]), y: smooth(p.map((q) => q[1]), a), line: { color: color(c.run), width: 1.5 } });
      });
      return traces;
    }
    D.groups.forEach((g, gi) => {
      const at = new Map();
      curves.filter((c) => g.runs.includes(c.run)).forEach((c) => {
        const p = points(c, x), ys = smooth(p.map((q) => q[1]), a);
        p.forEach((q, k) => at.set(q[0], (at.get(q[0]) || []).concat([ys[k]])));
      });
      if (!at.size) return;
      const xs = [...at.keys()].sort((p, q) => p - q);
      const stats = xs.map((v) => meanSd(at.get(v))), mean = stats.map((q) => q[0]), sd = stats.map((q) => q[1]);
      const name = plain(`${g.label} (n=${g.runs.length})`);
      traces.push({ type: "scatter", mode: "lines", x: xs.concat(xs.slice().reverse()), y: mean.map((v, k) => v + sd[k]).concat(mean.map((v, k) => v - sd[k]).reverse()),
        fill: "toself", fillcolor: color(gi) + "33", line: { width: 0 }, hoverinfo: "skip", showlegend: false, legendgroup: "g" + gi, name: name + " ±sd" });
      traces.push({ type: "scatter", mode: xs.length < 3 ? "lines+markers" : "lines", x: xs, y: mean, name, legendgroup: "g" + gi, line: { color: color(gi), width: 2 } });
    });
    return traces;
  }
  function drawCurves() {
    const x = $("x").value, a = +$("smooth").value, logy = $("logy").checked;
    const grouped = $("by-group") && $("by-group").checked && D.groups.length;
    $("smooth-value").textContent = a.toFixed(2);
    D.plots.forEach((plot, m) => {
      const div = plotDiv(plot, m), curves = D.curves[plot.metric];
      const traces = plot.bar ? barTraces(curves, grouped) : lineTraces(curves, grouped, x, a);
      const xlabel = plot.bar ? (grouped ? "group" : "run") : x === "time" ? "wall time (s, estimated from the run's mean time per step)" : x;
      const xaxis = plot.bar ? { title: { text: xlabel }, type: "category" } : { title: { text: xlabel } };
      Plotly.react(div, traces, { title: { text: plain(plot.metric) }, xaxis, yaxis: { title: { text: plain(plot.metric) }, type: logy ? "log" : "linear" },
        barmode: "overlay", hovermode: "closest", margin: { t: 40, r: 10 }, showlegend: traces.length <= 60 }, { displaylogo: false, responsive: true });
    });
  }
  ["x", "smooth", "logy", "by-group"].forEach((id) => $(id) && $(id).addEventListener("input", drawCurves));
  drawCurves();

  // A sweep: the sampled keys against a metric, parallel coordinates and a scatter per key.
  function drawSweep() {
    const m = D.monitor.find((q) => q.metric === $("sweep-metric").value);
    if (!m) return;
    const dims = D.keys.map((k) => {
      const vals = D.runs.map((r) => r.settings[k]);
      if (vals.every((v) => v === null || typeof v === "number")) return { label: plain(k), values: vals.map((v) => (v === null ? NaN : v)) };
      const cats = [...new Set(vals.map(String))];
      return { label: plain(k), values: vals.map((v) => cats.indexOf(String(v))), tickvals: cats.map((_, i) => i), ticktext: cats.map(plain) };
    });
    const done = D.runs.map((r) => r.cls === "completed");
    dims.push({ label: plain(m.metric), values: m.values.map((v) => (v === null ? NaN : v)) });
    Plotly.react("parcoords", [{ type: "parcoords", dimensions: dims, line: { color: m.values.map((v) => (v === null ? 0 : v)), colorscale: "Viridis", showscale: true } }],
      { margin: { l: 80, r: 80, t: 50 } }, { displaylogo: false });
    $("scatters").innerHTML = "";
    D.keys.forEach((k, i) => {
      const div = document.createElement("div");
      div.className = "plot";
      div.id = "scatter-" + i;
      $("scatters").appendChild(div);
      const mk = (ok) => {
        const idx = D.runs.map((_, j) => j).filter((j) => done[j] === ok && m.values[j] !== null);
        return { type: "scatter", mode: "markers", name: ok ? "completed" : "stopped / failed / running",
          x: idx.map((j) => plainValue(D.runs[j].settings[k])), y: idx.map((j) => m.values[j]), text: idx.map((j) => plain(D.runs[j].label + " — " + D.runs[j].status)),
          marker: ok ? { color: "#1f77b4", size: 8 } : { color: "#d62728", symbol: "x", size: 9 } };
      };
      Plotly.react(div, [mk(true), mk(false)], { title: { text: plain(k) }, xaxis: { title: { text: plain(k) } }, yaxis: { title: { text: plain(m.metric) } }, margin: { t: 40, r: 10 } }, { displaylogo: false });
    });
  }
  if (D.keys.length && D.monitor.length && D.runs.length > 1) {
    $("sweep-metric").innerHTML = D.monitor.map((q) => `<option>${esc(q.metric)}</option>`).join("");
    $("sweep-metric").addEventListener("input", drawSweep);
    drawSweep();
  } else {
    $("sweep-section").style.display = "none";
  }

  // Config diff of any two runs: every key either has, the differing ones marked.
  const opts = D.runs.map((r, i) => `<option value="${i}">${esc(r.label)}</option>`).join("");
  $("diff-a").innerHTML = opts;
  $("diff-b").innerHTML = opts;
  if (D.runs.length > 1) $("diff-b").value = "1";
  function drawDiff() {
    const a = D.runs[+$("diff-a").value], b = D.runs[+$("diff-b").value], only = $("diff-only").checked;
    const keys = [...new Set(Object.keys(a.config).concat(Object.keys(b.config)))];
    const show = (v) => (v === undefined ? "absent" : v);
    const rows = keys.filter((k) => !only || a.config[k] !== b.config[k]).map((k) => {
      const cls = a.config[k] !== b.config[k] ? ' class="differs"' : "";
      return `<tr${cls}><td>${esc(k)}</td><td${cls}>${esc(show(a.config[k]))}</td><td${cls}>${esc(show(b.config[k]))}</td></tr>`;
    });
    $("diff").innerHTML = `<thead><tr><th>key</th><th>${esc(a.label)}</th><th>${esc(b.label)}</th></tr></thead><tbody>` +
      (rows.join("") || '<tr><td colspan="3">the two configs are the same</td></tr>') + "</tbody>";
  }
  ["diff-a", "diff-b", "diff-only"].forEach((id) => $(id).addEventListener("input", drawDiff));
  drawDiff();
})();
