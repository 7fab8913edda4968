//! Drawing the grid of panels: size, layout, axes, series (markers, whiskers, segments between
//! neighbouring measured sizes) and each panel's legend.

use super::{Curve, Panel};
use crate::sizes::format_size;
use plotters::coord::{CoordTranslate, Shift};
use plotters::element::DashedPathElement;
use plotters::prelude::*;

/// One colour per series of a panel (at most six), told apart also in grey print.
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(0, 0, 0),
];
const PANEL_W: u32 = 640;
const PANEL_H: u32 = 480;
const TITLE_H: u32 = 44;
/// Height of one legend line.
const LEGEND_LINE: i32 = 17;

fn columns(panels: usize) -> usize {
    match panels {
        0 | 1 => 1,
        2..=4 => 2,
        _ => 3,
    }
}

/// The picture's size in pixels for `panels` panels.
pub(super) fn size(panels: usize) -> (u32, u32) {
    let cols = columns(panels);
    let rows = panels.div_ceil(cols).max(1);
    (cols as u32 * PANEL_W, TITLE_H + rows as u32 * PANEL_H)
}

/// Draws `panels` under `title` on `backend` (sized by [`size`]).
pub(super) fn grid<DB: DrawingBackend>(
    backend: DB,
    title: &str,
    panels: &[Panel],
) -> Result<(), String> {
    super::register_font()?;
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let root = backend.into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (top, body) = root.split_vertically(TITLE_H);
    top.draw(&Text::new(
        title.to_string(),
        (12, 12),
        ("sans-serif", 20).into_font(),
    ))
    .map_err(|x| e(&x))?;
    let cols = columns(panels.len());
    let rows = panels.len().div_ceil(cols).max(1);
    for (area, p) in body.split_evenly((rows, cols)).iter().zip(panels) {
        panel(area, p)?;
    }
    root.present().map_err(|x| e(&x))
}

/// A figure on the y axis: log10 of it on a log axis.
fn ty(log: bool, v: f64) -> f64 {
    if log {
        v.max(1e-12).log10()
    } else {
        v
    }
}

/// Whether no size of `sizes` lies strictly between `a` and `b`: only such points are joined.
fn neighbours(sizes: &[u64], a: u64, b: u64) -> bool {
    !sizes.iter().any(|&s| s > a.min(b) && s < a.max(b))
}

/// The dash (length, gap in pixels) of series `i` of a panel: ferry's (0) is solid, each
/// baseline's dash differs from the others', so that lines lying on one another still show
/// each (a baseline that equals another was hidden behind it).
pub(super) fn dash(i: usize) -> Option<(u32, u32)> {
    const DASHES: [(u32, u32); 5] = [(7, 5), (2, 3), (12, 4), (4, 7), (1, 5)];
    (i > 0).then(|| DASHES[(i - 1) % DASHES.len()])
}

/// The marker of series `i`: ferry's a filled circle; baselines hollow, each its own shape,
/// each smaller than the one before, so markers at one point nest inside one another instead
/// of covering each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// Filled circle (ferry).
    Dot,
    /// Hollow triangle.
    Triangle,
    /// Hollow square.
    Square,
    /// Hollow diamond.
    Diamond,
    /// A cross.
    Cross,
    /// Hollow circle.
    Ring,
}

/// [`Shape`] and size in pixels of series `i`'s marker.
pub(super) fn shape(i: usize) -> (Shape, i32) {
    const SHAPES: [Shape; 5] = [
        Shape::Triangle,
        Shape::Square,
        Shape::Diamond,
        Shape::Cross,
        Shape::Ring,
    ];
    match i {
        0 => (Shape::Dot, 4),
        _ => (SHAPES[(i - 1) % SHAPES.len()], 9 - (((i - 1) % 5) as i32)),
    }
}

/// The x axis's ticks: log2 of the sizes measured in the panel (no tick where no size was
/// measured); every other one, first and last kept, where more than 9 would crowd the axis.
pub(super) fn x_keys(sizes: &[u64]) -> Vec<f64> {
    let xs: Vec<f64> = sizes
        .iter()
        .filter(|&&s| s > 0)
        .map(|&s| (s as f64).log2())
        .collect();
    if xs.len() <= 9 {
        return xs;
    }
    let last = xs.len() - 1;
    let step = xs.len().div_ceil(9);
    (xs.iter().enumerate())
        .filter(|&(k, _)| k % step == 0 || k == last)
        .map(|(_, &x)| x)
        .collect()
}

/// A log2 size axis whose ticks are the given keys only ([`x_keys`]): plotters' own picks
/// evenly spaced points, sizes with no data among them.
struct Keyed {
    inner: plotters::coord::types::RangedCoordf64,
    keys: Vec<f64>,
}

impl Ranged for Keyed {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;
    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(v, limit)
    }
    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        self.keys.clone()
    }
    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }
}

fn marker_style(c: &Curve, color: RGBColor) -> ShapeStyle {
    if c.ferry {
        color.filled()
    } else {
        color.stroke_width(2)
    }
}

/// Draws the marker of series `i` of a panel at `at` ([`shape`]).
fn marker<DB: DrawingBackend, CT: CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    c: &Curve,
    i: usize,
    at: CT::From,
    color: RGBColor,
) -> Result<(), String>
where
    CT::From: Clone,
{
    let st = marker_style(c, color);
    let at = EmptyElement::at(at);
    let (sh, r) = if c.ferry {
        (Shape::Dot, 4)
    } else {
        shape(i.max(1))
    };
    match sh {
        Shape::Dot | Shape::Ring => area.draw(&(at + Circle::new((0, 0), r, st))),
        // An outline (plotters' TriangleMarker is always filled, and hid what lay under it).
        Shape::Triangle => area.draw(
            &(at + PathElement::new(vec![(0, -r), (r, r * 4 / 5), (-r, r * 4 / 5), (0, -r)], st)),
        ),
        Shape::Square => area.draw(&(at + Rectangle::new([(-r + 1, -r + 1), (r - 1, r - 1)], st))),
        Shape::Diamond => {
            area.draw(&(at + PathElement::new(vec![(0, -r), (r, 0), (0, r), (-r, 0), (0, -r)], st)))
        }
        Shape::Cross => area.draw(&(at + Cross::new((0, 0), r, st))),
    }
    .map_err(|x| x.to_string())
}

/// `lo..hi` where both ends are finite and `lo < hi` with a finite width, else None: plotters
/// lays out its labels by stepping over the range, and an endless range (a size of 0 on the log
/// axis, no point at all, a figure near `f64::MAX`) made it step forever.
fn axis(lo: f64, hi: f64) -> Option<std::ops::Range<f64>> {
    (lo.is_finite() && hi.is_finite() && lo < hi && (hi - lo).is_finite()).then_some(lo..hi)
}

/// A panel's axes: the x range (log2 of the size), the y range, and whether the y axis is
/// log10. An error, never an endless range, where the panel's points do not give finite ends.
fn ranges(p: &Panel) -> Result<(std::ops::Range<f64>, std::ops::Range<f64>, bool), String> {
    // Sizes of 0 (log2: -inf) are refused when a file is read; here they are only left out.
    let pts = || (p.curves.iter().flat_map(|c| c.points.iter())).filter(|q| q.0 > 0);
    let xs = pts().map(|q| (q.0 as f64).log2());
    let x0 = xs.clone().reduce(f64::min);
    let x1 = xs.reduce(f64::max);
    let (Some(x0), Some(x1)) = (x0, x1) else {
        return Err(format!("panel {}: no size to draw", p.title));
    };
    let x_range = axis(x0.floor() - 0.5, x1.ceil() + 0.5)
        .ok_or_else(|| format!("panel {}: no size to draw", p.title))?;
    let ys = || {
        pts()
            .flat_map(|q| [q.1, q.2, q.3])
            .filter(|y| y.is_finite())
    };
    let ymax = ys().fold(0.0, f64::max);
    let ymin = ys().filter(|&y| y > 0.0).reduce(f64::min);
    // Latency always, bandwidth spanning more than 20x (device next to PCIe), or figures too
    // large for a linear axis's headroom: a log10 y axis.
    let log = ymin.is_some_and(|m| p.latency || ymax / m > 20.0 || !(ymax * 1.08).is_finite());
    let y_range = match ymin {
        Some(m) if log => {
            let (lo, hi) = (m.log10().floor(), ymax.log10());
            axis(lo, hi + (hi - lo).max(0.5) * 0.06)
        }
        _ => axis(0.0, (ymax * 1.08).max(1e-3)),
    }
    .ok_or_else(|| format!("panel {}: no finite figure to draw", p.title))?;
    Ok((x_range, y_range, log))
}

fn panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &Panel) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    // The same room for every legend, so that the axes of a row of panels line up.
    let legend_h = LEGEND_LINE * super::MAX_SERIES as i32 + 16;
    let (_, h) = area.dim_in_pixel();
    let (plot_area, legend) = area.split_vertically(h as i32 - legend_h);
    let pts = || p.curves.iter().flat_map(|c| c.points.iter());
    let (x_range, y_span, log) = ranges(p)?;
    // Sizes measured in this panel: the x axis's only ticks, and a series is joined only to
    // its neighbour when no other measured size lies between them.
    let mut sizes: Vec<u64> = pts().map(|q| q.0).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let x_range = Keyed {
        inner: x_range.into(),
        keys: x_keys(&sizes),
    };
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(&p.title, ("sans-serif", 17))
        .margin(10)
        .margin_right(20)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(x_range, y_span.clone())
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc(if p.tests.iter().any(|t| t.contains("scatter")) {
            "size (bytes per copy or per segment)"
        } else {
            "size (bytes per copy)"
        })
        .y_desc(match (p.latency, log) {
            (true, _) => "us (log scale)",
            (false, true) => "GB/s (log scale)",
            (false, false) => "GB/s",
        })
        .y_labels(7)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 && *x >= 0.0 {
                format_size(2f64.powf(x.round()) as u64)
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| {
            let v = if log { 10f64.powf(*y) } else { *y };
            // Log axes: as many decimals as the first significant digit needs; linear axes:
            // up to two, trailing zeros dropped (0.25, 1.5, 2).
            let decimals = match (log, v > 0.0) {
                (true, true) => (-v.log10().floor()).max(0.0) as usize,
                (true, false) => 0,
                (false, _) => 2,
            };
            let t = format!("{v:.decimals$}");
            if t.contains('.') {
                t.trim_end_matches('0').trim_end_matches('.').to_string()
            } else {
                t
            }
        })
        .light_line_style(WHITE.mix(0.0))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .draw()
        .map_err(|x| e(&x))?;
    // Where a point is drawn: None for a size of 0 or a figure that is not finite; figures
    // beyond the axis are held a span past it (the area clips them; a point at -1e308 made a
    // line of 2^31 pixels, dashed in millions of pieces).
    let span = y_span.end - y_span.start;
    let at = |s: u64, v: f64| -> Option<(f64, f64)> {
        let x = (s as f64).log2();
        let y = ty(log, v);
        (x.is_finite() && v.is_finite() && y.is_finite())
            .then(|| (x, y.clamp(y_span.start - span, y_span.end + span)))
    };
    for (i, c) in p.curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let line = color.stroke_width(2);
        for w in c.points.windows(2) {
            let (a, b) = (w[0], w[1]);
            if !neighbours(&sizes, a.0, b.0) {
                continue;
            }
            let (Some(from), Some(to)) = (at(a.0, a.1), at(b.0, b.1)) else {
                continue;
            };
            let seg = vec![from, to];
            match dash(if c.ferry { 0 } else { i.max(1) }) {
                None => chart.draw_series(LineSeries::new(seg, line)),
                Some((d, g)) => chart.draw_series(DashedLineSeries::new(seg, d, g, line)),
            }
            .map_err(|x| e(&x))?;
        }
        for &(s, med, worst, best) in &c.points {
            let Some((x, mid)) = at(s, med) else { continue };
            // A whisker end that is not finite: the median stands for it.
            let end = |v: f64| at(s, v).map_or(mid, |p| p.1);
            let (lo, hi) = (end(worst.min(best)), end(worst.max(best)));
            let thin = color.stroke_width(1);
            let cap = |y| EmptyElement::at((x, y)) + PathElement::new(vec![(-4, 0), (4, 0)], thin);
            chart
                .draw_series([PathElement::new(vec![(x, lo), (x, hi)], thin)])
                .map_err(|x| e(&x))?;
            chart.draw_series([cap(lo), cap(hi)]).map_err(|x| e(&x))?;
            marker(chart.plotting_area(), c, i, (x, mid), color)?;
        }
    }
    // The legend under the axes: one line per series, its sample and marker, then its name.
    for (i, c) in p.curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let y = 6 + LEGEND_LINE * i as i32 + LEGEND_LINE / 2;
        let (x0, x1) = (60, 92);
        let line = color.stroke_width(2);
        match dash(if c.ferry { 0 } else { i.max(1) }) {
            None => legend.draw(&PathElement::new(vec![(x0, y), (x1, y)], line)),
            Some((d, g)) => {
                legend.draw(&DashedPathElement::new(vec![(x0, y), (x1, y)], d, g, line))
            }
        }
        .map_err(|x| e(&x))?;
        marker(&legend, c, i, ((x0 + x1) / 2, y), color)?;
        let mut label = c.label.clone();
        if label.chars().count() > 72 {
            label = label.chars().take(71).collect::<String>() + "…";
        }
        legend
            .draw(&Text::new(
                label,
                (x1 + 8, y - 7),
                ("sans-serif", 13).into_font(),
            ))
            .map_err(|x| e(&x))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_neighbouring_measured_sizes_are_joined() {
        let sizes = [4096, 65536, 1 << 20, 1 << 24];
        assert!(neighbours(&sizes, 4096, 65536));
        assert!(neighbours(&sizes, 1 << 24, 1 << 20));
        // A series measured at 4K and 16M only, in a panel that also measured 64K and 1M.
        assert!(!neighbours(&sizes, 4096, 1 << 24));
    }

    fn panel_of(latency: bool, points: Vec<(u64, f64, f64, f64)>) -> Panel {
        Panel {
            title: "t".into(),
            latency,
            tests: vec!["cpu-contig".into()],
            curves: vec![Curve {
                label: "cpu-contig: ferry".into(),
                ferry: true,
                points,
            }],
        }
    }

    /// Draws `p` into a string: the call must return (it spun forever on endless axes).
    fn draw(p: &Panel) -> Result<(), String> {
        let mut svg = String::new();
        grid(
            SVGBackend::with_string(&mut svg, size(1)),
            "t",
            std::slice::from_ref(p),
        )
    }

    #[test]
    fn axes_are_finite_or_refused_never_endless() {
        // A figure near f64::MAX: 1.08x headroom on a linear axis overflowed to inf (hung).
        let huge = panel_of(false, vec![(4096, f64::MAX, f64::MAX, f64::MAX)]);
        let (x, y, log) = ranges(&huge).unwrap();
        assert!(log && y.end.is_finite() && x.end.is_finite(), "{y:?}");
        draw(&huge).unwrap();
        // No point, or only a size of 0 (log2: -inf): no x axis, an error.
        for p in [
            panel_of(false, vec![]),
            panel_of(true, vec![(0, 1.0, 1.0, 1.0)]),
        ] {
            let e = draw(&p).unwrap_err();
            assert!(e.contains("no size to draw"), "{e}");
        }
        // A size of 0 beside a real one is left out; no positive figure: a linear axis.
        let p = panel_of(false, vec![(0, 1.0, 1.0, 1.0), (4096, 0.0, -1.0, f64::NAN)]);
        let (x, y, log) = ranges(&p).unwrap();
        assert_eq!((x, y, log), (11.5..12.5, 0.0..1e-3, false));
        draw(&p).unwrap();
        // The smallest and largest figures and sizes draw.
        let p = panel_of(
            true,
            vec![(1, 5e-324, 5e-324, 1.0), (u64::MAX, 1e300, 1.0, 1e300)],
        );
        draw(&p).unwrap();
    }

    /// Issue 33: one baseline's line hid another's (every baseline had the same dash).
    #[test]
    fn every_series_has_its_own_dash_and_marker() {
        assert_eq!(dash(0), None);
        let dashes: Vec<_> = (1..6).map(dash).collect();
        let shapes: Vec<_> = (0..6).map(shape).collect();
        for a in 0..5 {
            for b in a + 1..5 {
                assert_ne!(dashes[a], dashes[b], "{dashes:?}");
            }
        }
        for a in 0..6 {
            for b in a + 1..6 {
                assert_ne!(shapes[a].0, shapes[b].0, "{shapes:?}");
            }
        }
        // Later baselines smaller: markers at one point nest.
        assert!(
            shapes[1..].windows(2).all(|w| w[0].1 > w[1].1),
            "{shapes:?}"
        );
    }

    /// Issue 33: the x axis had ticks at sizes with no data.
    #[test]
    fn x_ticks_only_where_sizes_were_measured() {
        let sizes = [4 << 10, 64 << 10, 16 << 20];
        assert_eq!(x_keys(&sizes), vec![12.0, 16.0, 24.0]);
        // 4K..256M, 17 sizes: every other one, the first and last kept, all measured.
        let many: Vec<u64> = (12..=28).map(|k| 1u64 << k).collect();
        let keys = x_keys(&many);
        assert!(keys.len() <= 10, "{keys:?}");
        assert_eq!((keys[0], keys[keys.len() - 1]), (12.0, 28.0));
        assert!(keys.iter().all(|k| many.contains(&(2f64.powf(*k) as u64))));
        // Drawn: the x labels are the measured sizes only (no 8K, 32K ... between them).
        let p = Panel {
            title: "t".into(),
            latency: false,
            tests: vec!["cpu-contig".into()],
            curves: vec![Curve {
                label: "cpu-contig: ferry".into(),
                ferry: true,
                points: vec![(4 << 10, 1.0, 1.0, 1.0), (16 << 20, 2.0, 2.0, 2.0)],
            }],
        };
        let mut svg = String::new();
        grid(SVGBackend::with_string(&mut svg, size(1)), "t", &[p]).unwrap();
        // Each label is a text element's only line.
        let label = |t: &str| svg.lines().any(|l| l.trim() == t);
        assert!(label("4K") && label("16M"), "{svg}");
        for absent in ["8K", "64K", "256K", "1M", "4M"] {
            assert!(!label(absent), "{absent} in {svg}");
        }
    }

    #[test]
    fn the_grid_has_at_most_three_columns() {
        assert_eq!(size(1), (PANEL_W, TITLE_H + PANEL_H));
        assert_eq!(size(4), (2 * PANEL_W, TITLE_H + 2 * PANEL_H));
        assert_eq!(size(10), (3 * PANEL_W, TITLE_H + 4 * PANEL_H));
    }
}
