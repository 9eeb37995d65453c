// Rate charts (uPlot, vendored in static/vendor/). The server sends only current rates, by server-sent
// events; the page keeps the last MAX_POINTS of them, so a chart starts empty and fills while it is open.
(function () {
  var MAX_POINTS = 150; // 5 minutes at one point every 2 s

  function chart(el, names) {
    var data = [[]].concat(names.map(function () { return []; }));
    var colours = ["#12355b", "#b35900", "#0b5d1e", "#7a0000"];
    var opts = {
      width: Math.max(240, el.clientWidth), height: 200,
      series: [{}].concat(names.map(function (n, i) {
        return { label: n, stroke: colours[i % colours.length], width: 2 };
      })),
      axes: [{}, { size: 60 }],
      scales: { x: { time: true } }
    };
    var plot = new uPlot(opts, data, el);
    window.addEventListener("resize", function () {
      plot.setSize({ width: Math.max(240, el.clientWidth), height: 200 });
    });
    return {
      add: function (values) {
        data[0].push(Date.now() / 1000);
        values.forEach(function (v, i) { data[i + 1].push(v); });
        if (data[0].length > MAX_POINTS) { data.forEach(function (s) { s.shift(); }); }
        plot.setData(data);
        el.setAttribute("data-points", String(data[0].length));
      }
    };
  }

  function num(el, name) {
    var v = el.getAttribute(name);
    return v === null || v === "" ? null : Number(v);
  }

  window.isterCharts = { chart: chart, num: num };

  // The overview: live.js raises "ister:overview" after each fragment; the rates are data attributes.
  var msgs = document.getElementById("chart-msgs");
  if (msgs) {
    var bytes = document.getElementById("chart-bytes");
    var m = chart(msgs, ["publish msg/s", "dispatch msg/s"]);
    var b = chart(bytes, ["publish bytes/s", "dispatch bytes/s"]);
    var take = function () {
      var r = document.getElementById("rates");
      if (!r) { return; }
      m.add([num(r, "data-publish"), num(r, "data-dispatch")]);
      b.add([num(r, "data-publish-bytes"), num(r, "data-dispatch-bytes")]);
    };
    document.addEventListener("ister:overview", take);
    take();
  }

  // The topic page: its own event stream of the topic's rates (JSON).
  var topicMsgs = document.getElementById("topic-chart-msgs");
  if (topicMsgs) {
    var tm = chart(topicMsgs, ["in msg/s", "out msg/s"]);
    var tb = chart(document.getElementById("topic-chart-bytes"), ["in bytes/s", "out bytes/s"]);
    var status = document.getElementById("chart-status");
    var es = new EventSource(topicMsgs.getAttribute("data-events"));
    es.addEventListener("rates", function (e) {
      var r = JSON.parse(e.data);
      if (r.error) { status.textContent = r.error; return; }
      status.textContent = "";
      tm.add([r.msg_in, r.msg_out]);
      tb.add([r.byte_in, r.byte_out]);
    });
    es.onerror = function () { status.textContent = "The console lost its connection. Retrying…"; };
  }
})();
