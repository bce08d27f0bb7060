// outbox admin: refreshes the parts of a page marked data-refresh every
// 5 s without a full reload, and the "select all" checkbox. No other
// script runs on the page (its Content-Security-Policy allows only this
// file). The server renders every value escaped; this script moves that
// server-rendered markup, parsed inertly by DOMParser, and never builds
// markup from text.
(function () {
  "use strict";
  var every = 5000;

  function busy(el) {
    if (el.hasAttribute("data-refresh-unless-checked") && el.querySelector("input[type=checkbox]:checked")) {
      return true;
    }
    var a = document.activeElement;
    return a && el.contains(a) && (a.tagName === "INPUT" || a.tagName === "BUTTON");
  }

  function refresh(el) {
    if (busy(el) || document.hidden) return;
    var url = el.getAttribute("data-refresh") || window.location.pathname + window.location.search;
    var u = new URL(url, window.location.href);
    u.searchParams.set("fragment", "1");
    fetch(u.toString(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (r.status === 401) { window.location.reload(); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html === null || busy(el)) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById(el.id);
        if (!fresh) return;
        el.replaceChildren.apply(el, Array.prototype.slice.call(fresh.childNodes).map(function (n) { return document.adoptNode(n); }));
        el.setAttribute("data-refreshed", String(Date.now()));
        wire(el);
      })
      .catch(function () { /* the next tick tries again */ });
  }

  function wire(root) {
    root.querySelectorAll("[data-select-all]").forEach(function (box) {
      box.addEventListener("change", function () {
        var name = box.getAttribute("data-select-all");
        var form = box.closest("form") || document;
        form.querySelectorAll("input[type=checkbox][name='" + name + "']").forEach(function (c) { c.checked = box.checked; });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    wire(document);
    document.querySelectorAll("[data-refresh]").forEach(function (el) {
      setInterval(function () { refresh(el); }, every);
    });
  });
})();
