/* book.js: the site's keys, and a theme button with two states.
 *
 * Keys (pressed outside a text field, with no modifier; listed by '?'):
 *   '/' or 's'  open the search (the theme itself opens it on Ctrl+K / Cmd+K only;
 *               these click the sidebar's search button, as on mdBook and Sphinx sites)
 *   left/right  previous / next page (the theme's navigation_with_keys)
 *   '?'         this list of keys, in a dialog that Esc closes
 * Keys typed into a field (the search box itself, an exercise's editor) are left
 * alone; arrow keys on a focused slider move the slider.
 *
 * A box that scrolls sideways (a wide table; a live figure on a phone) carries
 * data-scroll-more ("left", "right" or both): book.css fades that side.
 *
 * The theme button: pydata-sphinx-theme cycles auto -> dark -> light, and one of
 * those states always looks like the one before it (auto is light or dark).
 * Here each click switches to the other theme of the two, and the choice is kept
 * (localStorage, as the theme does); until the first click the site follows the
 * system's setting.
 */
(function () {
  "use strict";
  var KEYS = [
    ["/", "or", "s", "Search the book"],
    ["\u2190", "", "\u2192", "Previous / next page (on a slider: move the slider)"],
    ["Ctrl", "+", "K", "Search (\u2318 K on a Mac)"],
    ["?", "", "", "This list of keys"],
    ["Esc", "", "", "Close the search or this list"],
  ];

  function typing(target) {
    if (!target) return false;
    if (target.isContentEditable) return true;
    var tag = target.tagName;
    if (tag === "TEXTAREA" || tag === "SELECT") return true;
    if (tag !== "INPUT") return false;
    return !/^(range|checkbox|radio|button|submit|reset)$/i.test(target.type || "");
  }

  function openSearch(event) {
    var buttons = Array.prototype.filter.call(
      document.querySelectorAll(".search-button__button"),
      function (b) { return b.getClientRects().length > 0; });
    var input = document.querySelector("#pst-search-dialog input, form.bd-search input");
    if (!buttons.length && !input) return;
    event.preventDefault();
    if (buttons.length) buttons[0].click();
    else input.focus();
  }

  var dialog = null;
  function keyHelp() {
    if (!dialog) {
      dialog = document.createElement("dialog");
      dialog.className = "book-keys";
      dialog.setAttribute("aria-labelledby", "book-keys-title");
      var rows = KEYS.map(function (k) {
        var keys = "<kbd>" + k[0] + "</kbd>";
        if (k[2]) keys += (k[1] === "or" ? " or " : " " + k[1] + " ") + "<kbd>" + k[2] + "</kbd>";
        return "<tr><td>" + keys + "</td><td>" + k[3] + "</td></tr>";
      }).join("");
      dialog.innerHTML = '<h2 id="book-keys-title">Keys</h2><table>' + rows +
        '</table><form method="dialog"><button>Close</button></form>';
      document.body.appendChild(dialog);
    }
    if (!dialog.open) dialog.showModal();
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented) return;
    if (event.key !== "/" && event.key !== "s" && event.key !== "?") return;
    if (typing(event.target) || (event.target.closest && event.target.closest(".cm-editor"))) return;
    if (document.querySelector("#pst-search-dialog[open]")) return;
    if (event.key === "?") {
      event.preventDefault();
      keyHelp();
    } else {
      openSearch(event);
    }
  });

  // Boxes that scroll sideways say where more is hidden (book.css fades that side).
  var SCROLLERS = ".bd-article .pst-scrollable-table-container, .bd-article .livefig-figure";
  function markScroll(box) {
    var more = [];
    if (box.scrollLeft > 1) more.push("left");
    if (box.scrollLeft + box.clientWidth < box.scrollWidth - 1) more.push("right");
    var value = more.join(" ");
    if ((box.dataset.scrollMore || "") !== value) {
      if (value) box.dataset.scrollMore = value;
      else delete box.dataset.scrollMore;
    }
  }
  function watchScrollers() {
    document.querySelectorAll(SCROLLERS).forEach(function (box) {
      if (box._scrollWatched) return;
      box._scrollWatched = true;
      box.addEventListener("scroll", function () { markScroll(box); }, { passive: true });
      if (window.ResizeObserver) new ResizeObserver(function () { markScroll(box); }).observe(box);
      markScroll(box);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watchScrollers);
  else watchScrollers();
  window.addEventListener("load", watchScrollers);

  // The theme button: light <-> dark (before the theme's own listener, which would cycle three).
  function setTheme(theme) {
    var root = document.documentElement;
    root.dataset.mode = theme;
    root.dataset.theme = theme;
    document.querySelectorAll(".dropdown-menu").forEach(function (el) {
      el.classList.toggle("dropdown-menu-dark", theme === "dark");
    });
    try {
      localStorage.setItem("mode", theme);
      localStorage.setItem("theme", theme);
    } catch (e) { /* private browsing: the choice lasts for this page */ }
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest(".theme-switch-button");
    if (!button) return;
    event.stopImmediatePropagation();
    event.preventDefault();
    setTheme(document.documentElement.dataset.theme === "dark" ? "light" : "dark");
  }, true);
  // The theme's listener follows the system's setting while the mode was auto; a
  // choice made here stays.
  if (window.matchMedia) {
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", function () {
      var mode = document.documentElement.dataset.mode;
      if (mode === "light" || mode === "dark") {
        setTimeout(function () { document.documentElement.dataset.theme = mode; }, 0);
      }
    });
  }
})();
