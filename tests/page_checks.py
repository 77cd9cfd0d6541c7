"""What a page view is checked for, measured in the page (site_visits.look).

``LAYOUT_JS``: the page's width and what sticks out of the screen, wide tables
that scroll with no cue; for each live
figure, whether its readouts are on screen, how wide its sliders are, and the
smallest text of its drawing in CSS pixels (font size times the drawing's scale).
``CONTRAST_JS``: WCAG contrast ratios of the text a reader reads (the caption under
each live figure and its code, labels, body text, inline code, table cells) on
the colour actually behind it (the backgrounds of its ancestors composited), and
the filters applied to the pictures of cell outputs.
"""

LAYOUT_JS = """() => {
  const vw = document.documentElement.clientWidth;
  const clips = e => {
    for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
      if (/auto|scroll|hidden|clip/.test(getComputedStyle(a).overflowX)
          && a.getBoundingClientRect().right <= vw + 1) return true;
    }
    return false;
  };
  const name = e => e.tagName.toLowerCase()
    + (e.className && typeof e.className === 'string'
       ? '.' + e.className.trim().split(/\\s+/).slice(0, 2).join('.') : '');
  const fixed = e => {  // a drawer or dialog of the theme, off screen by design
    for (let a = e; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).position === 'fixed') return true;
    }
    return false;
  };
  const out = [];
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.right <= vw + 1 || clips(e)) continue;
    if (e.closest('svg') && e.tagName.toLowerCase() !== 'svg') continue;
    if (fixed(e)) continue;
    out.push(e);
  }
  // the innermost: those with nothing sticking out inside them
  const wider = out.filter(e => !out.some(o => o !== e && e.contains(o)))
    .slice(0, 6).map(e => `${name(e)} right=`
      + `${Math.round(e.getBoundingClientRect().right)}:`
      + ` ${(e.innerText || '').trim().slice(0, 60)}`);
  const figures = [...document.querySelectorAll('.livefig')].map(fig => {
    const box = fig.querySelector('.livefig-figure');
    const svg = box && box.querySelector('svg');
    let smallest = null;
    if (svg) {
      const scale = svg.getScreenCTM() ? svg.getScreenCTM().a : 1;
      for (const t of svg.querySelectorAll('text')) {
        if (!t.textContent.trim() || !t.getClientRects().length) continue;
        const px = parseFloat(getComputedStyle(t).fontSize) * scale;
        smallest = smallest === null ? px : Math.min(smallest, px);
      }
    }
    const readouts = [...fig.querySelectorAll('.livefig-readout')];
    const sliders = [...fig.querySelectorAll('.livefig-controls input[type=range]')];
    return {
      smallest_text_px: smallest,
      readouts_off_screen: readouts.filter(o => {
        const r = o.getBoundingClientRect();
        return r.left < 0 || r.right > vw + 1 || r.width === 0;
      }).map(o => o.textContent),
      narrowest_slider: sliders.length
        ? Math.min(...sliders.map(s => s.getBoundingClientRect().width)) : null,
      box_scrolls: box ? box.scrollWidth > box.clientWidth + 1 : false,
      box_overflow: box ? getComputedStyle(box).overflowX : null,
      box_cue: box ? (box.dataset.scrollMore || '').includes('right')
        && getComputedStyle(box).maskImage !== 'none' : false,
    };
  });
  // Wide tables scroll in their box, faded where more is hidden (book.js, book.css).
  const uncued = [...document.querySelectorAll('main .pst-scrollable-table-container')]
    .filter(b => b.offsetParent && b.scrollWidth > b.clientWidth + 1
      && !((b.dataset.scrollMore || '').includes('right')
           && getComputedStyle(b).maskImage !== 'none'))
    .map(b => (b.innerText || '').trim().slice(0, 60));
  return {
    width: document.documentElement.scrollWidth, viewport: vw, wider, figures, uncued,
  };
}"""

CONTRAST_JS = """() => {
  const parse = c => {
    const m = c.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return [0, 0, 0, 0];
    const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, under) => {
    const a = top[3];
    return [0, 1, 2].map(i => top[i] * a + under[i] * (1 - a)).concat([1]);
  };
  const behind = e => {
    const layers = [];
    for (let a = e; a; a = a.parentElement) {
      const c = parse(getComputedStyle(a).backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] >= 1) break;
    }
    let color = [255, 255, 255, 1];
    for (const c of layers.reverse()) color = over(c, color);
    return color;
  };
  const lum = c => {
    const f = v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  };
  const ratio = e => {
    const bg = behind(e);
    const fg = over(parse(getComputedStyle(e).color), bg);
    const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    return (a + 0.05) / (b + 0.05);
  };
  const kinds = {
    'caption': '.livefig-status',
    'caption code': '.livefig-status code',
    'figure label': '.livefig-label',
    'readout': '.livefig-readout',
    'text': 'main article p',
    'inline code': 'main article p code',
    'table cell': 'main article td',
  };
  const found = {};
  for (const [kind, selector] of Object.entries(kinds)) {
    const els = [...document.querySelectorAll(selector)]
      .filter(e => e.getClientRects().length && e.textContent.trim()).slice(0, 40);
    if (!els.length) continue;
    let worst = null;
    for (const e of els) {
      const r = ratio(e);
      if (!worst || r < worst.ratio) {
        worst = {ratio: r, text: e.textContent.trim().slice(0, 50)};
      }
    }
    found[kind] = {
      min: Math.round(worst.ratio * 100) / 100, where: worst.text, n: els.length,
    };
  }
  const images = [...document.querySelectorAll('main .cell_output img')]
    .filter(i => i.getClientRects().length)
    .map(i => ({filter: getComputedStyle(i).filter, background: behind(i)}));
  return {text: found, images};
}"""
