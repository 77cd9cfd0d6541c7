/* book.js: '/' and 's' open the search box, as on mdBook and Sphinx sites.
 *
 * The theme (pydata-sphinx-theme) opens its search on Ctrl+K (Cmd+K on a Mac)
 * only. A bare '/' or 's' pressed outside a text field, with no modifier,
 * clicks the sidebar's search button, which opens the same search. Keys typed
 * into a field (the search box itself, an exercise's editor) are left alone.
 */
(function () {
  "use strict";
  function typing(target) {
    if (!target) return false;
    if (target.isContentEditable) return true;
    var tag = target.tagName;
    if (tag === "TEXTAREA" || tag === "SELECT") return true;
    if (tag !== "INPUT") return false;
    return !/^(range|checkbox|radio|button|submit|reset)$/i.test(target.type || "");
  }
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented) return;
    if (event.key !== "/" && event.key !== "s") return;
    if (typing(event.target) || (event.target.closest && event.target.closest(".cm-editor"))) return;
    var buttons = Array.prototype.filter.call(
      document.querySelectorAll(".search-button__button"),
      function (b) { return b.getClientRects().length > 0; });
    var input = document.querySelector("#pst-search-dialog input, form.bd-search input");
    if (!buttons.length && !input) return;
    event.preventDefault();
    if (buttons.length) buttons[0].click();
    else input.focus();
  });
})();
