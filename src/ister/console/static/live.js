// Live overview: the server sends the rendered fragment by server-sent events; EventSource reconnects
// by itself, and the page shows the unreachable banner while the console itself cannot be reached.
// Each update raises "ister:overview" on the document (charts.js takes the rates from it).
(function () {
  var target = document.getElementById("overview");
  var es = new EventSource("/events");
  es.addEventListener("overview", function (e) {
    target.innerHTML = JSON.parse(e.data);
    document.dispatchEvent(new CustomEvent("ister:overview"));
  });
  es.onerror = function () {
    target.innerHTML = '<div class="banner bad" role="alert" id="unreachable">The console lost its connection. Retrying…</div>';
  };
})();
