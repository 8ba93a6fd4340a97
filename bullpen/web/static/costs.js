// Draws the costs page's charts with uPlot from the page's JSON data block (#cost-charts): spend
// and tokens per day per group, and time to first token per hour. The tables beside the charts
// hold the same figures. Colours come from the stylesheet, so they follow the system's light or
// dark scheme; a change of scheme redraws the charts.
(function () {
  "use strict";
  const block = document.getElementById("cost-charts");
  if (!block || !window.uPlot) { return; }
  const data = JSON.parse(block.textContent);
  const dark = window.matchMedia("(prefers-color-scheme: dark)");
  const HEIGHT = 260;
  const SERIES_COLOURS = 10;
  let charts = [];

  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function money(value) {
    if (value == null) { return ""; }
    return "$" + (value < 0.01 && value > 0 ? value.toPrecision(2) : value.toFixed(2));
  }

  function count(value) {
    if (value == null) { return ""; }
    return value >= 1e6 ? (value / 1e6).toFixed(1) + "M" : value >= 1e3 ? (value / 1e3).toFixed(1) + "k" : String(value);
  }

  // Hours without runs are gaps, not lines drawn across them: a null after each hour whose
  // next one is not the hour after.
  function withGaps(x, ys) {
    const gx = [];
    const gys = ys.map(function () { return []; });
    x.forEach(function (t, i) {
      gx.push(t);
      ys.forEach(function (y, k) { gys[k].push(y[i]); });
      if (i + 1 < x.length && x[i + 1] - t > 3600) {
        gx.push(t + 3600);
        gys.forEach(function (y) { y.push(null); });
      }
    });
    return { x: gx, ys: gys };
  }

  function lines(kind) {
    if (kind === "latency") {
      const gapped = withGaps(data.latency.x, [data.latency.p50, data.latency.p95]);
      return {
        x: gapped.x,
        range: [data.since, data.until], // the whole range asked for, not only its busy hours
        xLabel: "Hour (UTC)",
        xValue: "{YYYY}-{MM}-{DD} {HH}:00",
        xTick: "{MM}-{DD}\n{HH}:00",
        series: [
          { label: "p50", values: gapped.ys[0] },
          { label: "p95", values: gapped.ys[1] },
        ],
        format: function (v) { return v == null ? "" : Math.round(v) + " ms"; },
      };
    }
    return {
      x: data.days,
      xLabel: "Day (UTC)",
      xValue: "{YYYY}-{MM}-{DD}",
      xTick: "{MM}-{DD}",
      series: data.series.map(function (s) { return { label: s.label, values: s[kind === "spend" ? "cost" : "tokens"] }; }),
      format: kind === "spend" ? money : count,
    };
  }

  function draw(el) {
    const chart = lines(el.dataset.chart);
    if (chart.x.length === 0 || chart.series.length === 0) { return; }
    const fg = css("--fg");
    const grid = { stroke: css("--line"), width: 1 };
    const axis = { stroke: fg, grid: grid, ticks: grid };
    const series = [{ label: chart.xLabel, value: chart.xValue }].concat(chart.series.map(function (s, i) {
      return {
        label: s.label,
        stroke: css("--series-" + (i % SERIES_COLOURS)),
        width: 2,
        points: { show: true, size: 5 },
        value: function (u, v) { return chart.format(v); },
      };
    }));
    const tick = window.uPlot.fmtDate(chart.xTick);
    const utc = function (ts) { return window.uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); };
    const x = { time: true };
    if (chart.range) { x.range = function () { return chart.range; }; }
    const opts = {
      width: Math.max(el.clientWidth, 280),
      height: HEIGHT,
      // The tables are in UTC; so are the charts' axes.
      tzDate: utc,
      scales: { x: x, y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.1 : 1]; } } },
      series: series,
      axes: [
        Object.assign({ values: function (u, ticks) { return ticks.map(function (t) { return tick(utc(t)); }); } }, axis),
        Object.assign({ size: 70, values: function (u, vals) { return vals.map(chart.format); } }, axis),
      ],
    };
    const values = [chart.x].concat(chart.series.map(function (s) { return s.values; }));
    charts.push(new window.uPlot(opts, values, el));
    el.dataset.scheme = dark.matches ? "dark" : "light";
  }

  function drawAll() {
    charts.forEach(function (c) { c.destroy(); });
    charts = [];
    document.querySelectorAll("[data-chart]").forEach(draw);
  }

  let pending = 0;
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(function () {
      charts.forEach(function (c) { c.setSize({ width: Math.max(c.root.parentElement.clientWidth, 280), height: HEIGHT }); });
    }, 150);
  });
  dark.addEventListener("change", drawAll);
  drawAll();
})();
