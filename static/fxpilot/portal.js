// Keep the live log at its end while new lines arrive, unless the reader has scrolled up to read.
(function () {
  "use strict";
  var follow = true;
  function log() { return document.getElementById("log"); }
  function isLog(event) { return log() !== null && event.detail && event.detail.target === log(); }
  document.addEventListener("DOMContentLoaded", function () {
    if (log()) { log().scrollTop = log().scrollHeight; }
  });
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    if (isLog(event)) { follow = log().scrollHeight - log().scrollTop - log().clientHeight < 40; }
  });
  document.addEventListener("htmx:oobAfterSwap", function (event) {
    if (isLog(event) && follow) { log().scrollTop = log().scrollHeight; }
  });
})();
