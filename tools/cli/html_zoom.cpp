#include "tools/cli/html_zoom.h"

namespace memsim::cli {

// Plain ES5, no network, no eval; see the header for the SVG it expects.
void write_zoom_script(std::FILE* out) {
  std::fputs(R"JS(<script>
(function () {
  var svg = document.getElementById('memsim-timeline');
  var g = document.getElementById('memsim-zoom');
  if (!svg || !g) return;
  var L = +svg.getAttribute('data-left'), R = +svg.getAttribute('data-right');
  var N = +svg.getAttribute('data-events'), single = svg.getAttribute('data-single') === '1';
  var W = R - L, lo = 0, hi = 1, minSpan = Math.max(1e-6, single && N > 1 ? 4 / (N - 1) : 1e-3);
  var caption = document.getElementById('memsim-xcaption');
  var fullCaption = caption ? caption.textContent : '';
  var brush = document.getElementById('memsim-brush');
  function viewX(clientX) {
    var r = svg.getBoundingClientRect();
    var vb = svg.viewBox.baseVal;
    return vb.x + (clientX - r.left) * vb.width / r.width;
  }
  function shareAt(x) { return lo + Math.min(Math.max((x - L) / W, 0), 1) * (hi - lo); }
  function fmt(s) { return single ? String(Math.round(s * (N - 1))) : (100 * s).toFixed(1) + '%'; }
  function apply() {
    var k = 1 / (hi - lo), t = L - k * L - k * lo * W;
    g.setAttribute('transform', 'translate(' + t + ',0) scale(' + k + ',1)');
    var marks = svg.querySelectorAll('.zx');
    for (var i = 0; i < marks.length; ++i) {
      var e = marks[i], x = +e.getAttribute('data-x'), nx = k * x + t;
      var dx = +(e.getAttribute('data-dx') || 0), x1 = e.getAttribute('data-x1');
      var hide = nx < L - 0.5 || nx > R + 0.5;
      if (x1 !== null) {  // a band's label: at the band's visible start, if 40 units show
        var end = Math.min(k * +x1 + t, R);
        nx = Math.max(nx, L);
        hide = end - nx < 40;
      }
      e.setAttribute(e.tagName.toLowerCase() === 'circle' ? 'cx' : 'x', nx + dx);
      e.style.display = hide ? 'none' : '';
    }
    if (caption) {
      caption.textContent = lo === 0 && hi === 1 ? fullCaption
          : (single ? 'events ' + fmt(lo) + ' to ' + fmt(hi) + ' of ' + N
                    : 'share of the run\u2019s events ' + fmt(lo) + ' to ' + fmt(hi)) +
            ' (double-click or reset zoom to see the whole run)';
    }
    svg.setAttribute('data-zoom', lo.toFixed(4) + ',' + hi.toFixed(4));
  }
  function zoomTo(a, b) {
    if (b < a) { var t = a; a = b; b = t; }
    if (b - a < minSpan) { var m = (a + b) / 2; a = m - minSpan / 2; b = m + minSpan / 2; }
    if (a < 0) { b -= a; a = 0; }
    if (b > 1) { a -= b - 1; b = 1; }
    lo = Math.max(0, a); hi = Math.min(1, b);
    apply();
  }
  function reset() { lo = 0; hi = 1; apply(); }
  var dragFrom = null;
  svg.addEventListener('mousedown', function (ev) {
    if (ev.button !== 0) return;
    dragFrom = viewX(ev.clientX);
    ev.preventDefault();
  });
  window.addEventListener('mousemove', function (ev) {
    if (dragFrom === null || !brush) return;
    var x = Math.min(Math.max(viewX(ev.clientX), L), R), a = Math.min(Math.max(dragFrom, L), R);
    brush.setAttribute('x', Math.min(a, x));
    brush.setAttribute('width', Math.abs(x - a));
    brush.style.display = '';
  });
  window.addEventListener('mouseup', function (ev) {
    if (dragFrom === null) return;
    var x = viewX(ev.clientX), from = dragFrom;
    dragFrom = null;
    if (brush) brush.style.display = 'none';
    if (Math.abs(x - from) > 4) zoomTo(shareAt(from), shareAt(x));
  });
  svg.addEventListener('wheel', function (ev) {
    ev.preventDefault();
    var s = shareAt(viewX(ev.clientX)), f = ev.deltaY < 0 ? 0.8 : 1.25;
    var span = Math.min(1, Math.max(minSpan, (hi - lo) * f));
    var a = s - (s - lo) * span / (hi - lo);
    zoomTo(a, a + span);
  }, {passive: false});
  svg.addEventListener('dblclick', reset);
  var button = document.getElementById('memsim-zoom-reset');
  if (button) button.addEventListener('click', reset);
  var m = /zoom=([0-9.]+),([0-9.]+)/.exec(location.hash);
  if (m) zoomTo(+m[1], +m[2]); else apply();
})();
</script>
)JS",
             out);
}

}  // namespace memsim::cli
