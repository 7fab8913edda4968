//! `ferry bench --gantt FILE.svg|FILE.png`: a pipeline run's timeline as a Gantt chart, one row
//! per step (upload, compute, download), one bar per chunk (four colours in turn, so neighbours differ), so that the
//! overlap of copies and compute is visible at a glance.

use crate::plot::{Format, PlotError};
use ferry::pipeline::{Phase, Timeline};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const ROWS: [Phase; 3] = [Phase::Upload, Phase::Compute, Phase::Download];
const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

/// Writes `t` as a Gantt chart titled `title`; the format follows the extension.
pub fn write(t: &Timeline, title: &str, path: &Path) -> Result<(), PlotError> {
    let name = path.display().to_string();
    let format = Format::of(path)?;
    if t.chunks.is_empty() {
        return Err(PlotError::Empty);
    }
    let size = (1400, 420);
    let res = match format {
        Format::Svg => draw(SVGBackend::new(path, size).into_drawing_area(), t, title),
        Format::Png => draw(BitMapBackend::new(path, size).into_drawing_area(), t, title),
    };
    res.map_err(|message| PlotError::Draw {
        // plotters' error text is a Debug chain; where the file is the cause, say so plainly.
        message: crate::args::writable(path).err().unwrap_or(message),
        path: name,
    })
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    t: &Timeline,
    title: &str,
) -> Result<(), String> {
    crate::plot::register_font()?;
    let e = |x: &dyn std::fmt::Display| x.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let end = t.wall_us().max(1.0);
    let (scale, unit) = if end > 20_000.0 {
        (1e-3, "ms")
    } else {
        (1.0, "us")
    };
    let caption = format!(
        "{title}: busy upload {:.0}, compute {:.0}, download {:.0}, wall {:.0} {unit}",
        t.busy_us(Phase::Upload) * scale,
        t.busy_us(Phase::Compute) * scale,
        t.busy_us(Phase::Download) * scale,
        end * scale
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(45)
        .y_label_area_size(90)
        .build_cartesian_2d(0.0..end * scale * 1.01, 0.0..3.0)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc(format!("time ({unit}, {:?} clock)", t.clock))
        .y_labels(0)
        .disable_y_mesh()
        .draw()
        .map_err(|x| e(&x))?;
    for c in &t.chunks {
        let color = COLORS[c.chunk.index % COLORS.len()];
        for (row, phase) in ROWS.iter().enumerate() {
            let Some(s) = c.get(*phase) else { continue };
            let y = (2 - row) as f64;
            let bar = Rectangle::new(
                [(s.start_us * scale, y + 0.15), (s.end_us * scale, y + 0.85)],
                color.filled(),
            );
            chart.draw_series([bar]).map_err(|x| e(&x))?;
        }
    }
    for (row, phase) in ROWS.iter().enumerate() {
        let y = (2 - row) as f64 + 0.5;
        let label = Text::new(phase.to_string(), (0.0, y), ("sans-serif", 16));
        chart.draw_series([label]).map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))
}
