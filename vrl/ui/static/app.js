/* vrl ui: one page, hash routes, data from /api/... (or, in a report, from the embedded
 * bundle). Every repository string reaches the DOM through textContent or an attribute,
 * never through innerHTML: commit messages and ref names are untrusted. */
"use strict";

(function () {
  const REPORT = (function () {
    const node = document.getElementById("vrl-data");
    return node ? JSON.parse(node.textContent) : null;
  })();
  const PALETTE = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#0a7a8a",
                   "#d1246f", "#57606a", "#fb8500", "#2da44e", "#6639ba", "#a40e26"];
  const state = { summary: null, version: null, runs: null, metric: null, smooth: 0.6,
                  xaxis: "step", heatRev: null, diffA: "", diffB: "" };
  const main = document.getElementById("main");
  window.__vrl = state;  // for tests and the curious

  // ------------------------------------------------------------------ helpers
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  // replaceChildren would show a left-out (null) child as the text "null"
  function fill(node, ...children) {
    node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  }
  const short = (id) => (id ? id.slice(0, 12) : "");
  function fmt(value) {
    if (value === null || value === undefined) return "-";
    if (typeof value === "number") {
      if (Number.isInteger(value)) return String(value);
      const abs = Math.abs(value);
      return abs !== 0 && (abs < 1e-3 || abs >= 1e6) ? value.toExponential(3)
        : String(Number(value.toPrecision(4)));
    }
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }
  const isNum = (v) => typeof v === "number" && Number.isFinite(v);
  function qs(params) {
    const parts = [];
    for (const [key, value] of Object.entries(params)) {
      for (const v of [].concat(value)) {
        if (v !== undefined && v !== null) parts.push(encodeURIComponent(key) + "=" + encodeURIComponent(v));
      }
    }
    return parts.join("&");
  }
  function expand(data) {
    // a report keeps a branched run's shared points once: {prefix: {key, n}} + the rest
    if (!data || !data.prefix) return data;
    const base = expand(REPORT.api[data.prefix.key]);
    return Object.assign({}, data, { points: base.points.slice(0, data.prefix.n).concat(data.points) });
  }
  async function api(route, params) {
    if (REPORT && params) {  // the report keys commit pages by id: resolve names first
      const named = Object.assign({}, state.summary ? state.summary.tags : {},
                                  state.summary ? state.summary.branches : {});
      if (route === "commit" && named[params.rev]) params = { rev: named[params.rev] };
    }
    const key = route + (params && Object.keys(params).length ? "?" + qs(params) : "");
    if (REPORT) {
      if (!(key in REPORT.api)) {
        throw new Error(route === "commit"
          ? `This report holds the pages of the labelled commits, branch points and the newest snapshots of each run; \`vrl show ${params.rev}\` shows this one.`
          : "not included in this report: " + key);
      }
      return expand(REPORT.api[key]);
    }
    const response = await fetch("/api/" + key, { cache: "no-store" });
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || response.statusText);
    return data;
  }
  function colorOf(name) {
    const names = Object.keys(state.summary.branches);
    const i = names.indexOf(name);
    if (i >= 0) return PALETTE[i % PALETTE.length];
    let h = 0;
    for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
    return PALETTE[h % PALETTE.length];
  }
  state.colorOf = colorOf;  // (a function: tests read a run's colour)
  function pills(refs) {
    return (refs || []).map((r) => el("span", { class: "pill " + r.kind, text: r.name }));
  }
  function showError(err) {
    fill(main, el("p", { class: "error", text: String(err.message || err) }));
  }
  function table(headers, rows, opts) {
    opts = opts || {};
    const thead = el("tr", {}, headers.map((h, i) => el("th", {
      class: (opts.sortable ? "sortable" : "") + (opts.numeric && opts.numeric[i] ? " num" : ""),
      text: h, "data-col": i })));
    const body = el("tbody");
    const render = (list) => body.replaceChildren(...list.map((r) => r.node));
    const entries = rows.map((cells) => ({ cells: cells.values || cells,
      node: el("tr", { class: cells.cls || null, onclick: cells.onclick || null },
               (cells.values || cells).map((c, i) => c instanceof Node ? el("td", {}, c)
                 : el("td", { class: (opts.numeric && opts.numeric[i]) || isNum(c) ? "num" : null,
                              text: fmt(c) }))) }));
    render(entries);
    if (opts.sortable) {
      let col = -1, dir = 1;
      thead.addEventListener("click", (ev) => {
        const th = ev.target.closest("th");
        if (!th) return;
        const c = Number(th.dataset.col);
        dir = c === col ? -dir : (opts.numeric && opts.numeric[c] ? -1 : 1);
        col = c;
        thead.querySelectorAll("th").forEach((t) => t.classList.remove("sorted-asc", "sorted-desc"));
        th.classList.add(dir > 0 ? "sorted-asc" : "sorted-desc");
        const key = (e) => { const v = e.cells[c]; return v instanceof Node ? v.textContent : v; };
        entries.sort((a, b) => {
          const x = key(a), y = key(b);
          if (x === y) return 0;
          if (x === null || x === undefined) return 1;
          if (y === null || y === undefined) return -1;
          return (isNum(x) && isNum(y) ? x - y : String(x).localeCompare(String(y))) * dir;
        });
        render(entries);
      });
    }
    return el("div", { class: "scroll" }, el("table", { class: "grid" }, el("thead", {}, thead), body));
  }
  function flashLive(text) {
    const live = document.getElementById("live");
    live.textContent = text;
    live.classList.add("flash");
    setTimeout(() => live.classList.remove("flash"), 800);
  }

  // ------------------------------------------------------------------ graph
  function graphSvg(commits, lanes, rowH, laneW) {
    // lanes come from the server: an edge to parents[k] leaves (row, lane), runs down
    // parent_lanes[k] from the next row, and joins the parent at its row
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    const w = Math.max(1, lanes) * laneW + 8, h = commits.length * rowH;
    svg.setAttribute("width", w); svg.setAttribute("height", h);
    const x = (lane) => 8 + lane * laneW, y = (r) => r * rowH + rowH / 2;
    // a lane takes the colour of the run whose head starts it (the colour the run has in
    // every other view); a lane no branch starts keeps a colour of its own
    const owner = {}, open = {}, colors = [];
    const laneColor = (lane) => (owner[lane] ? colorOf(owner[lane]) : PALETTE[lane % PALETTE.length]);
    commits.forEach((c) => {
      const branch = (c.refs || []).find((r) => r.kind !== "tag");
      if (open[c.lane] !== c.id) owner[c.lane] = branch ? branch.name : null;  // a lane starts here
      colors.push(laneColor(c.lane));
      c.parents.forEach((p, k) => {
        const lane = c.parent_lanes[k];
        if (k && open[lane] !== p) owner[lane] = owner[c.lane];  // a merge edge: the child's
        open[lane] = p;
      });
    });
    const row = new Map(commits.map((c, i) => [c.id, i]));
    const line = (d, color) => {
      const path = document.createElementNS(NS, "path");
      path.setAttribute("d", d); path.setAttribute("fill", "none");
      path.setAttribute("stroke", color); path.setAttribute("stroke-width", "2");
      svg.append(path);
    };
    commits.forEach((c, i) => {
      const x0 = x(c.lane), y0 = y(i);
      c.parents.forEach((p, k) => {
        const r1 = row.get(p), lane = c.parent_lanes[k];
        if (r1 === undefined) { line(`M${x0},${y0} L${x0},${y0 + rowH / 2}`, colors[i]); return; }
        const xl = x(lane), x1 = x(commits[r1].lane);
        let d = `M${x0},${y0}`;
        if (xl !== x0) d += ` C${x0},${y0 + rowH * 0.6} ${xl},${y0 + rowH * 0.4} ${xl},${y0 + rowH}`;
        if (xl !== x1 && r1 > i + 1) {
          d += ` L${xl},${y(r1) - rowH} C${xl},${y(r1) - rowH * 0.4} ${x1},${y(r1) - rowH * 0.6} ${x1},${y(r1)}`;
        } else d += ` L${x1},${y(r1)}`;
        line(d, colors[i]);
      });
    });
    commits.forEach((c, i) => {
      const dot = document.createElementNS(NS, "circle");
      const labelled = c.refs && c.refs.length;
      dot.setAttribute("cx", x(c.lane)); dot.setAttribute("cy", y(i));
      dot.setAttribute("r", labelled ? 5 : 3.5);
      dot.setAttribute("fill", labelled ? colors[i] : "#fff");
      dot.setAttribute("stroke", colors[i]); dot.setAttribute("stroke-width", "2");
      dot.setAttribute("data-color", colors[i]);
      svg.append(dot);
    });
    return { svg, width: w };
  }
  async function viewGraph() {
    const early = state.earlyGraph;  // asked for with the summary when the page opened
    state.earlyGraph = null;
    const data = (early && await early) || await api("graph");
    const commits = data.commits;
    const rowH = 26, laneW = 14;
    const { svg, width } = graphSvg(commits, data.lanes, rowH, laneW);
    const rows = commits.map((c) => el("div", {
      class: "row", "data-id": c.id, style: `padding-left:${width + 6}px`,
      onclick: () => { location.hash = "#/commit/" + c.id; } },
      el("span", { class: "id", text: short(c.id) }), pills(c.refs),
      el("span", { class: "msg", text: c.message }),
      el("span", { class: "meta", text: (c.step !== null && c.step !== undefined ? "step " + c.step + "  " : "") +
                                        (c.time || "").replace("T", " ").slice(0, 19) })));
    const graph = el("div", { class: "graph", id: "graph" }, svg, rows);
    const b = Object.keys(state.summary.branches).length;
    fill(main,
      el("h1", { text: "History" }),
      el("p", { class: "muted", text: `${commits.length} commits on ${b} branch${b === 1 ? "" : "es"}` +
        (data.truncated ? ` (newest ${commits.length} shown)` : "") }),
      commits.length ? graph : el("p", { text: "No commits yet." }));
  }

  // ------------------------------------------------------------------ curves
  function smooth(values, weight) {
    if (!weight) return values;
    let last = 0, n = 0;
    return values.map((v) => {
      if (!isNum(v)) return v;
      last = last * weight + (1 - weight) * v;
      n += 1;
      return last / (1 - Math.pow(weight, n));  // debiased EMA, as TensorBoard does
    });
  }
  async function viewCurves(metric) {
    const s = state.summary;
    if (metric) state.metric = metric;
    const branches = Object.keys(s.branches);
    if (!state.runs) state.runs = branches.slice(0, 10);
    if (!state.metric || !s.metrics.includes(state.metric)) state.metric = s.default_metric;
    const chartBox = el("div", { class: "chart", id: "chart" });
    const side = el("div", { class: "side" },
      el("h3", { text: "Metric" }),
      el("select", { id: "metric", onchange: (ev) => { location.hash = "#/curves/" + encodeURIComponent(ev.target.value); } },
         s.metrics.map((m) => el("option", { value: m, text: m, selected: m === state.metric }))),
      el("h3", { text: "Runs" }),
      branches.map((b) => el("label", {},
        el("input", { type: "checkbox", value: b, checked: state.runs.includes(b), onchange: (ev) => {
          state.runs = ev.target.checked ? state.runs.concat([b]) : state.runs.filter((r) => r !== b);
          drawCurves(chartBox); } }),
        el("span", { class: "swatch", style: "background:" + colorOf(b) }), b)),
      el("h3", { text: "Smoothing" }),
      el("input", { type: "range", id: "smooth", min: 0, max: 0.99, step: 0.01, value: state.smooth,
        oninput: (ev) => { state.smooth = Number(ev.target.value);
          document.getElementById("smooth-value").textContent = state.smooth.toFixed(2);
          drawCurves(chartBox); } }),
      el("span", { id: "smooth-value", class: "muted", text: state.smooth.toFixed(2) }),
      el("h3", { text: "X axis" }),
      ["step", "time"].map((x) => el("label", {},
        el("input", { type: "radio", name: "xaxis", value: x, checked: state.xaxis === x,
          onchange: () => { state.xaxis = x; drawCurves(chartBox); } }), x === "step" ? " step" : " wall time")));
    fill(main, el("h1", { text: "Curves" }),
      s.metrics.length ? el("div", { class: "layout" }, side, chartBox)
        : el("p", { class: "muted", text: "No metrics recorded yet." }));
    if (s.metrics.length) await drawCurves(chartBox);
  }
  let drawing = 0;
  async function drawCurves(box) {
    const ticket = ++drawing;
    const runs = state.runs.slice(), metric = state.metric;
    const all = await Promise.all(runs.map((r) => api("curves", { metric: metric, rev: r })));
    if (ticket !== drawing) return;  // a newer request replaced this one
    const xi = state.xaxis === "step" ? 0 : 1;
    const tables = [], series = [{ label: state.xaxis === "step" ? "step" : "time" }], counts = {};
    all.forEach((data, i) => {
      const pts = data.points.filter((p) => isNum(p[xi])).sort((a, b) => a[xi] - b[xi]);
      const xs = [], ys = [];
      for (const p of pts) {
        if (xs.length && xs[xs.length - 1] === p[xi]) { ys[ys.length - 1] = p[2]; continue; }
        xs.push(p[xi]); ys.push(isNum(p[2]) ? p[2] : null);
      }
      counts[runs[i]] = xs.length;
      tables.push([xs, smooth(ys, state.smooth)]);
      series.push({ label: runs[i], stroke: colorOf(runs[i]), width: 2, spanGaps: true,
                    points: { show: xs.length < 60 } });
    });
    box.dataset.points = JSON.stringify(counts);
    box.dataset.metric = metric;
    if (state.chart) { state.chart.destroy(); state.chart = null; }
    box.replaceChildren();
    if (!tables.length) { box.append(el("p", { class: "muted", text: "Pick a run." })); return; }
    const data = uPlot.join(tables);
    const width = Math.max(400, box.clientWidth || 800);
    state.chart = new uPlot({
      width: width, height: 420, series: series,
      scales: { x: { time: state.xaxis === "time" } },
      legend: { live: true },
      axes: [{ label: state.xaxis === "step" ? "step" : "" }, { label: metric, size: 70 }],
      cursor: { drag: { x: true, y: false } },
    }, data, box);
    state.curvesAt = performance.now();
  }

  // ------------------------------------------------------------------ scalars dashboard
  // every metric as a small chart (a card), grouped by prefix as TensorBoard does; one
  // run selector and one smoothing slider for all cards; the data is one /api/scalars
  // answer (every metric of the chosen runs, by column)
  function runPicker(onchange) {
    return Object.keys(state.summary.branches).map((b) => el("label", { title: b },
      el("input", { type: "checkbox", class: "run-pick", value: b, checked: state.runs.includes(b),
        onchange: (ev) => {
          state.runs = ev.target.checked ? state.runs.concat([b]) : state.runs.filter((r) => r !== b);
          onchange(); } }),
      el("span", { class: "swatch", style: "background:" + colorOf(b) }), b));
  }
  function smoothSlider(onchange) {
    return [el("input", { type: "range", id: "smooth", min: 0, max: 0.99, step: 0.01, value: state.smooth,
      oninput: (ev) => { state.smooth = Number(ev.target.value);
        document.getElementById("smooth-value").textContent = state.smooth.toFixed(2);
        onchange(); } }),
      el("span", { id: "smooth-value", class: "muted", text: state.smooth.toFixed(2) })];
  }
  async function viewScalars() {
    const s = state.summary;
    if (!state.runs) state.runs = Object.keys(s.branches).slice(0, 10);
    const grid = el("div", { id: "scalars", class: "scalars" });
    const filter = el("input", { type: "search", id: "scalar-filter", placeholder: "filter metrics (regex)",
      value: state.scalarFilter || "", oninput: (ev) => { state.scalarFilter = ev.target.value; filterCards(grid); } });
    const side = el("div", { class: "side" },
      el("h3", { text: "Runs" }), runPicker(() => drawScalars(grid)),
      el("h3", { text: "Smoothing" }), smoothSlider(() => resmooth(grid)),
      el("h3", { text: "Metrics" }), filter);
    fill(main, el("h1", { text: "Scalars" }),
      s.metrics.length ? el("div", { class: "layout" }, side, grid)
        : el("p", { class: "muted", text: "No metrics recorded yet." }));
    if (s.metrics.length) await drawScalars(grid);
  }
  let scalarTicket = 0;
  async function drawScalars(grid) {
    const ticket = ++scalarTicket;
    const runs = state.runs.slice();
    // a report holds every run's answer once; the server answers for the chosen runs
    const data = REPORT ? await api("scalars") : runs.length ? await api("scalars", { rev: runs }) : { runs: [], groups: [] };
    if (ticket !== scalarTicket) return;  // a newer selection replaced this one
    const chosen = data.runs.filter((r) => runs.includes(r.name));
    const names = new Set(chosen.flatMap((r) => Object.keys(r.values)));
    for (const card of state.cards || []) card.chart.destroy();
    state.cards = [];
    state.scalarsData = chosen;
    grid.replaceChildren();
    grid.dataset.runs = JSON.stringify(chosen.map((r) => r.name));
    if (!chosen.length) { grid.append(el("p", { class: "muted", text: "Pick a run." })); return; }
    state.collapsed = state.collapsed || {};
    for (const group of data.groups) {
      const metrics = group.metrics.filter((m) => names.has(m));
      if (!metrics.length) continue;
      const cards = el("div", { class: "cards" });
      const box = el("details", { class: "group", "data-group": group.group, open: !state.collapsed[group.group],
        ontoggle: (ev) => { state.collapsed[group.group] = !ev.target.open; } },
        el("summary", {}, el("span", { class: "group-name", text: group.group || "other" }),
          el("span", { class: "muted", text: ` ${metrics.length}` })), cards);
      grid.append(box);
      for (const metric of metrics) scalarCard(metric, chosen, cards);
    }
    filterCards(grid);
    grid.dataset.smooth = String(state.smooth);
  }
  function cardTables(metric, runs) {
    // per run [steps, values] sorted by step, a step logged twice keeping its last value
    return runs.filter((r) => r.values[metric]).map((r) => {
      const pairs = r.steps.map((x, i) => [x, r.values[metric][i]]).filter((p) => isNum(p[0]) && p[1] !== null)
        .sort((a, b) => a[0] - b[0]);
      const xs = [], ys = [];
      for (const [x, y] of pairs) {
        if (xs.length && xs[xs.length - 1] === x) { ys[ys.length - 1] = y; continue; }
        xs.push(x); ys.push(y);
      }
      return { name: r.name, xs: xs, ys: ys };
    }).filter((t) => t.xs.length);
  }
  function joined(tables) {
    return uPlot.join(tables.map((t) => [t.xs, smooth(t.ys, state.smooth)]));
  }
  function scalarCard(metric, runs, parent) {
    const tables = cardTables(metric, runs);
    const plot = el("div", { class: "card-plot" });
    const card = el("div", { class: "card", "data-metric": metric, "data-series": tables.length },
      el("div", { class: "card-title", title: metric, text: metric }), plot);
    parent.append(card);  // first: the chart takes the card's width
    if (!tables.length) { plot.append(el("p", { class: "muted", text: "no values" })); return; }
    const tip = document.getElementById("tooltip");
    const chart = new uPlot({
      width: Math.max(240, (plot.clientWidth || 330) - 4), height: 190, legend: { show: false },
      scales: { x: { time: false } },
      series: [{ label: "step" }].concat(tables.map((t) => ({ label: t.name, stroke: colorOf(t.name),
        width: 1.6, spanGaps: true, points: { show: t.xs.length < 30 } }))),
      axes: [{ size: 28, font: "10px sans-serif" }, { size: 52, font: "10px sans-serif" }],
      cursor: { drag: { x: true, y: false } },
      hooks: { setCursor: [(u) => {
        const i = u.cursor.idx;
        if (i === null || i === undefined || u.cursor.left < 0) { tip.hidden = true; return; }
        const lines = [metric, "step " + fmt(u.data[0][i])];
        for (let k = 1; k < u.series.length; k++) {
          const v = u.data[k][i];
          if (isNum(v)) lines.push(`${u.series[k].label}  ${fmt(v)}`);
        }
        const r = u.over.getBoundingClientRect();
        tip.textContent = lines.join("\n");
        tip.style.left = r.left + u.cursor.left + 14 + "px"; tip.style.top = r.top + u.cursor.top + 14 + "px";
        tip.hidden = false;
      }] },
    }, joined(tables), plot);
    chart.over.addEventListener("mouseleave", () => { tip.hidden = true; });
    state.cards.push({ metric: metric, chart: chart, tables: tables });
  }
  function resmooth(grid) {
    for (const card of state.cards || []) card.chart.setData(joined(card.tables));
    grid.dataset.smooth = String(state.smooth);
  }
  function filterCards(grid) {
    let re = null;
    try { re = state.scalarFilter ? new RegExp(state.scalarFilter, "i") : null; } catch (err) { re = null; }
    grid.querySelectorAll(".card").forEach((c) => { c.hidden = re !== null && !re.test(c.dataset.metric); });
    grid.querySelectorAll("details.group").forEach((g) => {
      g.hidden = !g.querySelector(".card:not([hidden])");
    });
  }

  // ------------------------------------------------------------------ compare
  async function viewCompare() {
    const data = await api("compare");
    const s = state.summary;
    if (!state.compareMetrics) {
      // the return and its smoothed form, as `vrl compare` shows; else the first four
      const returns = data.metrics.filter((m) => (s.return_metrics || []).includes(m));
      state.compareMetrics = returns.length ? returns : data.metrics.slice(0, 4);
    }
    const out = el("div", { id: "compare-table" });
    const draw = () => {
      const shown = data.metrics.filter((m) => state.compareMetrics.includes(m));
      const headers = ["run", "step", "snapshots", "branched from"].concat(data.params,
        ...shown.map((m) => [m, m + " (best)"]));
      const numeric = headers.map((h, i) => i === 1 || i === 2 || i >= 4 + data.params.length ||
        data.rows.some((r) => isNum(r.hparams[data.params[i - 4]])));
      const rows = data.rows.map((r) => ({ values: [
        el("a", { href: "#/commit/" + r.id, text: r.name }), r.step, r.snapshots, r.branch_point]
        .concat(data.params.map((k) => r.hparams[k]),
                ...shown.map((m) => r.metrics[m] ? r.metrics[m] : [null, null])) }));
      fill(out, data.rows.length ? table(headers, rows, { sortable: true, numeric: numeric })
        : el("p", { class: "muted", text: "No runs yet." }));
    };
    const picker = el("details", { class: "picker" }, el("summary", { text: "metrics shown" }),
      el("div", { class: "picks" }, data.metrics.map((m) => el("label", {},
        el("input", { type: "checkbox", checked: state.compareMetrics.includes(m), onchange: (ev) => {
          state.compareMetrics = ev.target.checked ? state.compareMetrics.concat([m])
            : state.compareMetrics.filter((x) => x !== m);
          draw(); } }), " " + m))));
    fill(main, el("h1", { text: "Compare runs" }),
      el("p", { class: "muted", text: `One row per run (branch head): the ${data.params.length} hyperparameters that differ between the rows, then metrics (last value and best). Click a column to sort.` }),
      data.metrics.length ? picker : null, out,
      data.rows.length && data.metrics.length ? scatterSection(data) : null);
    draw();
  }

  // hyperparameter (x) against a metric's last value (y), one dot per run
  function scatterSection(data) {
    const xs = data.params.concat(["step", "snapshots"]);
    if (!state.scatterX || !xs.includes(state.scatterX)) state.scatterX = xs[0];
    if (!state.scatterY || !data.metrics.includes(state.scatterY)) {
      state.scatterY = data.metrics.includes(state.summary.default_metric) ? state.summary.default_metric : data.metrics[0];
    }
    const plot = el("div", { id: "scatter", class: "scatter" });
    const pick = (id, list, key) => el("select", { id: id, onchange: (ev) => { state[key] = ev.target.value; drawScatter(plot, data); } },
      list.map((v) => el("option", { value: v, text: v, selected: v === state[key] })));
    const box = el("div", {}, el("h2", { text: "Hyperparameter vs metric" }),
      el("div", { class: "toolbar" }, "x", pick("scatter-x", xs, "scatterX"),
        "y (last value)", pick("scatter-y", data.metrics, "scatterY")), plot);
    drawScatter(plot, data);
    return box;
  }
  function drawScatter(plot, data) {
    const NS = "http://www.w3.org/2000/svg";
    const xKey = state.scatterX, yKey = state.scatterY;
    const xOf = (r) => (xKey === "step" || xKey === "snapshots" ? r[xKey] : r.hparams[xKey]);
    const pts = data.rows.map((r) => ({ name: r.name, id: r.id, x: xOf(r),
      y: r.metrics[yKey] ? r.metrics[yKey][0] : null })).filter((p) => p.x !== undefined && p.x !== null && isNum(p.y));
    // numbers on a linear (or, spanning decades, log) axis; anything else by category
    const numeric = pts.every((p) => isNum(p.x));
    const cats = numeric ? [] : [...new Set(pts.map((p) => fmt(p.x)))].sort();
    const xv = (p) => (numeric ? p.x : cats.indexOf(fmt(p.x)));
    const W = 640, H = 320, L = 64, R = 16, T = 12, B = 40;
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H);
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const add = (tag, attrs, text) => {
      const n = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
      if (text !== undefined) n.textContent = text;
      svg.append(n);
      return n;
    };
    plot.replaceChildren(svg);
    plot.dataset.points = pts.length;
    if (!pts.length) { plot.replaceChildren(el("p", { class: "muted", text: "no run has both values" })); return; }
    const xsv = pts.map(xv), ysv = pts.map((p) => p.y);
    const log = numeric && Math.min(...xsv) > 0 && Math.max(...xsv) / Math.min(...xsv) >= 100;
    const tx = (v) => (log ? Math.log10(v) : v);
    let [x0, x1] = [Math.min(...xsv.map(tx)), Math.max(...xsv.map(tx))];
    let [y0, y1] = [Math.min(...ysv), Math.max(...ysv)];
    if (!numeric) { x0 = -0.5; x1 = cats.length - 0.5; }
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y0 -= 1; y1 += 1; }
    const padX = numeric ? (x1 - x0) * 0.06 : 0, padY = (y1 - y0) * 0.08;
    x0 -= padX; x1 += padX; y0 -= padY; y1 += padY;
    const sx = (v) => L + (tx(v) - x0) / (x1 - x0) * (W - L - R);
    const sxc = (i) => L + (i - x0) / (x1 - x0) * (W - L - R);
    const sy = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
    add("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#d0d7de" });
    for (let k = 0; k <= 4; k++) {  // y ticks
      const v = y0 + (y1 - y0) * k / 4;
      add("line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v), stroke: "#eaeef2" });
      add("text", { x: L - 6, y: sy(v) + 4, "text-anchor": "end", class: "tick" }, fmt(Number(v.toPrecision(3))));
    }
    const ticks = numeric ? [0, 1, 2, 3, 4].map((k) => (log ? Math.pow(10, x0 + (x1 - x0) * k / 4) : x0 + (x1 - x0) * k / 4)) : cats;
    ticks.forEach((t, k) => {
      const x = numeric ? sx(t) : sxc(k);
      // (the end ticks inside the frame: their labels would be cut off at the edge)
      const anchor = numeric && k === 0 ? "start" : numeric && k === ticks.length - 1 ? "end" : "middle";
      add("text", { x: x, y: H - B + 16, "text-anchor": anchor, class: "tick" }, numeric ? fmt(Number(t.toPrecision(3))) : t);
    });
    add("text", { x: L + (W - L - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis" }, xKey + (log ? " (log)" : ""));
    add("text", { x: 12, y: T + (H - T - B) / 2, "text-anchor": "middle", class: "axis",
                  transform: `rotate(-90 12 ${T + (H - T - B) / 2})` }, yKey);
    for (const p of pts) {
      const cx = numeric ? sx(p.x) : sxc(xv(p)), cy = sy(p.y);
      const a = document.createElementNS(NS, "a");
      a.setAttribute("href", "#/commit/" + p.id);
      const dot = document.createElementNS(NS, "circle");
      dot.setAttribute("cx", cx); dot.setAttribute("cy", cy); dot.setAttribute("r", 6);
      dot.setAttribute("fill", colorOf(p.name)); dot.setAttribute("class", "dot");
      dot.setAttribute("data-run", p.name);
      const title = document.createElementNS(NS, "title");
      title.textContent = `${p.name}\n${xKey} = ${fmt(p.x)}\n${yKey} = ${fmt(p.y)}`;
      dot.append(title); a.append(dot); svg.append(a);
      if (pts.length <= 24) {  // (left of the dot near the right edge: not cut off)
        const right = cx > W - 140;
        add("text", { x: right ? cx - 8 : cx + 8, y: cy - 6, class: "label",
                      "text-anchor": right ? "end" : "start" }, p.name);
      }
    }
  }

  // ------------------------------------------------------------------ commit page
  function layerTable(layers) {
    // as `vrl diff` prints it: model layers (named without the model prefix), then
    // optimizer state with the parameter it belongs to, then other state (not a layer)
    const max = Math.max(1e-12, ...layers.map((l) => (isNum(l.rel) ? l.rel : 0)));
    const cls = (l) => (l.frozen ? "frozen " : "") + (l.status === "added" ? "added" : l.status === "removed" ? "removed" : "");
    const stats = (l) => [l.shape, l.status,
      el("span", {}, el("span", { class: "bar" + (l.material ? " material" : ""),
        style: `width:${isNum(l.rel) ? Math.max(1, 60 * Math.sqrt(l.rel / max)) : 0}px` }),
        isNum(l.rel) ? l.rel.toExponential(2) : "-"),
      isNum(l.max_abs) && l.status === "changed" ? l.max_abs.toExponential(2) : "-", l.material ? "yes" : "no"];
    const head = ["shape", "status", "rel change", "max abs", "material"];
    const num = [false, false, true, true, false];
    const name = (l) => el("span", { class: "layer mono", title: l.layer, text: l.label || l.layer });
    const model = layers.filter((l) => (l.kind || "model") === "model");
    const optim = layers.filter((l) => l.kind === "optimizer");
    const other = layers.filter((l) => l.kind === "other");
    if (!optim.length && !other.length && !model.some((l) => l.label && l.label !== l.layer)) {
      return el("div", { class: "layers", "data-kinds": "model" },
        table(["layer"].concat(head), model.map((l) => ({ cls: cls(l), values: [name(l)].concat(stats(l)) })),
              { numeric: [false].concat(num) }));
    }
    const prefix = model.length && model[0].label ? model[0].layer.slice(0, model[0].layer.length - model[0].label.length) : "";
    return el("div", { class: "layers", "data-kinds": ["model", "optimizer", "other"].filter((k) => layers.some((l) => l.kind === k)).join(",") },
      table([`model layer (${prefix})`].concat(head), model.map((l) => ({ cls: cls(l), values: [name(l)].concat(stats(l)) })),
            { numeric: [false].concat(num) }),
      optim.length ? el("h3", { class: "section", text: "Optimizer state" }) : null,
      optim.length ? table(["optimizer state", "parameter"].concat(head), optim.map((l) => ({ cls: cls(l),
        values: [name(l), el("span", { class: "mono", text: l.parameter || "?" })].concat(stats(l)) })),
        { numeric: [false, false].concat(num) }) : null,
      other.length ? el("h3", { class: "section", text: "Other state (not a layer)" }) : null,
      other.length ? table(["other state", "shape", "status"], other.map((l) => ({ cls: cls(l),
        values: [name(l)].concat(stats(l).slice(0, 2)) }))) : null);
  }
  function kvTable(items, cols) {
    return table(cols, items.map((it) => ({ cls: it.cls || null, values: it.values })));
  }
  async function viewCommit(rev) {
    const c = await api("commit", { rev: rev });
    const parents = c.parents.map((p, i) => el("span", {}, i ? ", " : "",
      el("a", { href: "#/commit/" + p, class: "mono", text: short(p) })));
    fill(main,
      el("h1", {}, "Commit ", el("span", { class: "mono", text: short(c.id) }), " ", pills(c.refs)),
      el("dl", { class: "kv" },
        el("dt", { text: "id" }), el("dd", { class: "mono", text: c.id }),
        el("dt", { text: "parents" }), el("dd", {}, parents.length ? parents : "none (root)"),
        el("dt", { text: "author" }), el("dd", { text: c.author }),
        el("dt", { text: "time" }), el("dd", { text: c.time }),
        el("dt", { text: "step" }), el("dd", { text: fmt(c.step) }),
        el("dt", { text: "layers" }), el("dd", { text: c.summary || "-" }),
        c.parents.length && !REPORT ? el("dt", { text: "diff" }) : null,  // (a report holds no such diff)
        c.parents.length && !REPORT ? el("dd", {}, el("a", { href: `#/diff/${c.parents[0]}/${c.id}`, text: "against parent" }))
          : null),
      el("pre", { class: "message", text: c.message || "(no message)" }),
      c.merge && c.merge.length ? el("pre", { class: "merge", id: "merge-recipe", text: c.merge.join("\n") }) : null,
      c.gif && !REPORT ? el("figure", { class: "eval-gif" },
        el("img", { id: "eval-gif", src: "/api/gif?" + qs({ rev: c.id }), alt: "eval episode of " + short(c.id) }),
        el("figcaption", { class: "muted", text: "evaluation episode (vrl eval --gif)" })) : null,
      el("div", { class: "cols" },
        el("div", {}, el("h2", { text: "Hyperparameters" }),
          c.hparams.length ? kvTable(c.hparams.map((h) => ({ cls: h.status === "same" ? null : h.status,
            values: [el("span", { class: "mono", text: h.key }), fmt(h.value),
                     h.status === "same" ? "" : h.status === "added" ? "(new)" : fmt(h.old)] })),
            ["key", "value", "parent"])
            : el("p", { class: "muted", text: "none" })),
        el("div", {}, el("h2", { text: "Metrics" }),
          c.metrics.length ? kvTable(c.metrics.map((m) => ({ values: [
            el("span", { class: "mono", text: m.key }), m.value, m.old === undefined ? null : m.old] })),
            ["metric", "value", "parent"]) : el("p", { class: "muted", text: "none" }),
          el("h2", { text: "Environment" }),
          c.env.length ? kvTable(c.env.map((e) => ({ values: [el("span", { class: "mono", text: e.key }), fmt(e.value)] })),
            ["key", "value"]) : el("p", { class: "muted", text: "none" }))),
      el("h2", { text: "Layers" + (c.frozen.length ? ` (${c.frozen.length} frozen)` : "") }),
      c.layers.length ? layerTable(c.layers) : el("p", { class: "muted", text: "no layer statistics" }),
      c.meta.length ? el("h2", { text: "Metadata" }) : null,
      c.meta.length ? kvTable(c.meta.map((e) => ({ values: [el("span", { class: "mono", text: e.key }), fmt(e.value)] })),
        ["key", "value"]) : null);
  }

  // ------------------------------------------------------------------ diff
  async function viewDiff(a, b) {
    const s = state.summary;
    const names = Object.keys(s.branches).concat(Object.keys(s.tags));
    state.diffA = a || state.diffA || (names[1] || names[0] || "");
    state.diffB = b || state.diffB || (names[0] || "");
    const list = el("datalist", { id: "revs" }, names.map((n) => el("option", { value: n })));
    const inA = el("input", { type: "text", id: "diff-a", list: "revs", value: state.diffA });
    const inB = el("input", { type: "text", id: "diff-b", list: "revs", value: state.diffB });
    const go = () => { location.hash = `#/diff/${encodeURIComponent(inA.value)}/${encodeURIComponent(inB.value)}`; };
    const out = el("div", { id: "diff-out" });
    fill(main, el("h1", { text: "Diff" }),
      el("div", { class: "toolbar" }, "from", inA, "to", inB, el("button", { onclick: go, text: "Compare" }), list),
      out);
    if (!state.diffA || !state.diffB) return;
    let d;
    try { d = await api("diff", { a: state.diffA, b: state.diffB }); } catch (err) {
      fill(out, el("p", { class: "error", text: String(err.message || err) })); return;
    }
    fill(out,
      el("p", {}, el("a", { href: "#/commit/" + d.a, class: "mono", text: short(d.a) }), " \u2192 ",
        el("a", { href: "#/commit/" + d.b, class: "mono", text: short(d.b) }), "  ",
        el("span", { class: "muted", text: d.summary || "" })),
      el("h2", { text: "Layers" }),
      d.layers ? layerTable(d.layers)
        : el("p", { class: "muted", text: "Layer changes need tensor data that is not here: " + (d.error || "") }),
      el("div", { class: "cols" },
        el("div", {}, el("h2", { text: "Hyperparameters that differ" }),
          d.hparams.length ? kvTable(d.hparams.map((h) => ({ cls: h.status,
            values: [el("span", { class: "mono", text: h.key }), h.status === "added" ? "-" : fmt(h.old),
                     h.status === "removed" ? "-" : fmt(h.value)] })), ["key", "from", "to"])
            : el("p", { class: "muted", text: "identical" })),
        el("div", {}, el("h2", { text: "Metrics" }),
          d.metrics.length ? kvTable(d.metrics.map((m) => ({ values: [el("span", { class: "mono", text: m.key }),
            m.old === undefined ? null : m.old, m.status === "removed" ? null : m.value] })),
            ["metric", "from", "to"]) : el("p", { class: "muted", text: "none" }))));
  }

  // ------------------------------------------------------------------ heatmap
  const HEAT_LUT = Array.from({ length: 256 }, (_, i) => heatColor(Math.pow(10, -6 + 6 * i / 255)));
  function heatColorFast(rel) {
    const i = Math.round((Math.log10(rel) + 6) / 6 * 255);
    return HEAT_LUT[i < 0 ? 0 : i > 255 ? 255 : i];
  }
  function heatColor(rel) {
    // log10(rel) from -6 (blue, hardly moved) to 0 (yellow, moved as much as its norm)
    const t = Math.min(1, Math.max(0, (Math.log10(rel) + 6) / 6));
    const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    const f = t * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(f)), u = f - i;
    const c = stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * u));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }
  async function viewHeatmap(rev) {
    const s = state.summary;
    const names = Object.keys(s.branches);
    state.heatRev = rev || state.heatRev ||
      (names.includes(s.current_branch) ? s.current_branch : names[0]);
    const picker = el("select", { id: "heat-rev", onchange: (ev) => { location.hash = "#/heatmap/" + encodeURIComponent(ev.target.value); } },
      names.map((n) => el("option", { value: n, text: n, selected: n === state.heatRev })));
    const wrap = el("div", { class: "heat-wrap", id: "heatmap" });
    fill(main, el("h1", { text: "Layer changes" }),
      el("div", { class: "toolbar" }, "branch", picker,
        el("span", { class: "muted", text: "layers \u00d7 snapshots along the first-parent line; colour = relative change against the parent; \u2715 = frozen by dirty-layer training" })),
      wrap, legend());
    if (!state.heatRev) { wrap.replaceChildren(el("p", { class: "muted", text: "No commits yet." })); return; }
    const h = await api("heatmap", { rev: state.heatRev });
    drawHeatmap(wrap, h);
  }
  function legend() {
    const c = el("canvas", { width: 200, height: 10 });
    const ctx = c.getContext("2d");
    for (let x = 0; x < 200; x++) { ctx.fillStyle = heatColor(Math.pow(10, -6 + 6 * x / 199)); ctx.fillRect(x, 0, 1, 10); }
    return el("div", { class: "legend" }, "1e-6", c, "1", el("span", { class: "swatch", style: "background:#eaeef2" }), "no change / no data");
  }
  function drawHeatmap(wrap, h) {
    const nl = h.layers.length, nc = h.commits.length;
    const labelW = Math.min(260, 12 + 7 * Math.max(4, ...h.layers.map((l) => l.length)));
    const cw = Math.max(2, Math.min(36, Math.floor(((wrap.clientWidth || 1000) - labelW - 20) / Math.max(1, nc))));
    const ch = nl > 80 ? 10 : nl > 20 ? 16 : 22;
    const W = labelW + cw * nc + 4, H = ch * nl + 24;
    const dpr = window.devicePixelRatio || 1;
    const canvas = el("canvas", { width: Math.ceil(W * dpr), height: Math.ceil(H * dpr),
      style: `width:${W}px;height:${H}px`, "data-layers": nl, "data-commits": nc });
    const ctx = canvas.getContext("2d");
    ctx.scale(dpr, dpr);
    ctx.font = "11px ui-monospace, monospace";
    ctx.textBaseline = "middle";
    let frozenCells = 0;
    const frozenSets = h.frozen.map((list) => new Set(list));
    for (let i = 0; i < nl; i++) {
      ctx.fillStyle = "#1f2328";
      let label = h.layers[i];
      while (label.length > 3 && ctx.measureText(label).width > labelW - 10) label = "\u2026" + label.slice(2);
      ctx.fillText(label, 2, i * ch + ch / 2);
      const row = h.values[i], frozen = frozenSets[i];
      for (let j = 0; j < nc; j++) {
        const v = row[j], x = labelW + j * cw, y = i * ch;
        ctx.fillStyle = isNum(v) && v > 0 ? heatColorFast(v) : "#eaeef2";
        ctx.fillRect(x, y, Math.max(1, cw - (cw > 4 ? 1 : 0)), ch - 1);
        if (frozen.has(j)) {
          frozenCells++;
          ctx.strokeStyle = "#57606a"; ctx.lineWidth = 1.2;
          ctx.beginPath(); ctx.moveTo(x + 1, y + 1); ctx.lineTo(x + cw - 2, y + ch - 2);
          ctx.moveTo(x + cw - 2, y + 1); ctx.lineTo(x + 1, y + ch - 2); ctx.stroke();
        }
      }
    }
    ctx.fillStyle = "#656d76";
    const every = Math.max(1, Math.ceil(60 / cw));
    for (let j = 0; j < nc; j += every) {
      const c = h.commits[j];
      ctx.fillText(c.step !== null && c.step !== undefined ? String(c.step) : short(c.id).slice(0, 7),
                   labelW + j * cw, nl * ch + 12);
    }
    canvas.dataset.frozen = frozenCells;
    const tip = document.getElementById("tooltip");
    const cell = (ev) => {
      const r = canvas.getBoundingClientRect();
      const j = Math.floor((ev.clientX - r.left - labelW) / cw), i = Math.floor((ev.clientY - r.top) / ch);
      return i >= 0 && i < nl && j >= 0 && j < nc ? [i, j] : null;
    };
    canvas.addEventListener("mousemove", (ev) => {
      const at = cell(ev);
      if (!at) { tip.hidden = true; return; }
      const [i, j] = at, c = h.commits[j], v = h.values[i][j];
      tip.textContent = `${h.layers[i]}\n${short(c.id)}  step ${fmt(c.step)}\nrel change ${isNum(v) ? v.toExponential(2) : "-"}` +
        (frozenSets[i].has(j) ? "\nfrozen" : "");
      tip.style.left = ev.clientX + 12 + "px"; tip.style.top = ev.clientY + 12 + "px"; tip.hidden = false;
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
    canvas.addEventListener("click", (ev) => {
      const at = cell(ev);
      if (at) { tip.hidden = true; location.hash = "#/commit/" + h.commits[at[1]].id; }
    });
    wrap.replaceChildren(canvas);
    if (h.truncated) wrap.append(el("p", { class: "muted", text: `newest ${nc} snapshots shown` }));
  }

  // ------------------------------------------------------------------ router and live updates
  const VIEWS = { "": viewGraph, scalars: viewScalars, curves: viewCurves, compare: viewCompare, commit: viewCommit,
                  diff: viewDiff, heatmap: viewHeatmap };
  async function render() {
    const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
    const name = parts[0] in VIEWS ? parts[0] : "";
    // a revision may hold slashes (origin/exp, best/run-1): one-argument views take the rest
    const args = name === "commit" || name === "heatmap" || name === "curves"
      ? [parts.slice(1).join("/")].filter(Boolean)
      : parts.slice(1);
    document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active",
      a.dataset.view === (name === "" ? "graph" : name === "commit" ? "" : name)));
    try {
      await VIEWS[name](...args);
      main.dataset.view = name || "graph";
      state.renderedAt = performance.now();  // read by bench/ui_bench.py
      main.dataset.version = state.version;
    } catch (err) { showError(err); }
  }
  async function loadSummary() {
    state.summary = await api("summary");
    state.version = state.summary.version;
    document.getElementById("repo-name").textContent = state.summary.repo;
    document.title = "vrl \u00b7 " + state.summary.repo;
  }
  async function poll() {
    try {
      const v = await api("version");
      document.getElementById("live").classList.remove("offline");
      if (v.version !== state.version) {
        await loadSummary();
        await render();
        flashLive("updated " + new Date().toLocaleTimeString());
      }
    } catch (err) {
      const live = document.getElementById("live");
      live.classList.add("offline"); live.textContent = "server unreachable";
    }
    setTimeout(poll, 2000);
  }
  async function start() {
    if (!REPORT && location.hash.replace(/^#\/?/, "") === "") {
      state.earlyGraph = api("graph").catch(() => null);
    }
    try { await loadSummary(); } catch (err) { showError(err); return; }
    window.addEventListener("hashchange", render);
    window.addEventListener("resize", () => {
      const box = document.getElementById("chart");
      if (state.chart && box) state.chart.setSize({ width: Math.max(400, box.clientWidth), height: 420 });
      for (const card of (document.getElementById("scalars") && state.cards) || []) {
        const plot = card.chart.root.parentNode;
        card.chart.setSize({ width: Math.max(240, plot.clientWidth - 4), height: 190 });
      }
    });
    await render();
    const live = document.getElementById("live");
    if (REPORT) { live.classList.add("report"); live.textContent = "report of " + REPORT.created; }
    else { live.textContent = "live"; setTimeout(poll, 2000); }
    document.body.dataset.ready = "1";
  }
  start();
})();
