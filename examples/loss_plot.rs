//! The training example's loss curves: every `loss-N.json` a run wrote,
//! drawn to one PNG with `plotters`.

use std::path::{Path, PathBuf};

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Every `loss-N.json` in `out`, drawn to `out/loss.png`.
pub fn plot(out: &Path) -> Result<PathBuf, String> {
    use plotters::prelude::*;
    // (ranks, replicas, losses) of each `loss-N.json` / `loss-N-dpR.json`.
    let mut curves: Vec<(usize, usize, Vec<f32>)> = Vec::new();
    for entry in std::fs::read_dir(out).map_err(err)? {
        let path = entry.map_err(err)?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let Some(label) = name
            .strip_prefix("loss-")
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let (ranks, replicas) = match label.split_once("-dp") {
            Some((n, r)) => (n, r),
            None => (label, "1"),
        };
        let (Ok(ranks), Ok(replicas)) = (ranks.parse(), replicas.parse()) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).map_err(err)?;
        curves.push((ranks, replicas, serde_json::from_str(&text).map_err(err)?));
    }
    curves.sort_by_key(|c| (c.1, c.0));
    let font = Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf");
    let labels = match std::fs::read(font) {
        Ok(bytes) => plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            Box::leak(bytes.into_boxed_slice()),
        )
        .is_ok(),
        Err(_) => false,
    };
    let steps = curves.iter().map(|c| c.2.len()).max().unwrap_or(1).max(2);
    let top = curves
        .iter()
        .flat_map(|c| c.2.iter().copied())
        .fold(0.0f32, f32::max)
        * 1.05;
    let png = out.join("loss.png");
    let root = BitMapBackend::new(&png, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if labels {
        builder
            .caption("training loss (cross-entropy per byte)", ("sans-serif", 22))
            .x_label_area_size(40)
            .y_label_area_size(50);
    }
    let mut chart = builder
        .build_cartesian_2d(0..steps, 0f32..top.max(1e-3))
        .map_err(err)?;
    if labels {
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("loss")
            .draw()
            .map_err(err)?;
    }
    let colors = [BLUE, RED, GREEN, MAGENTA];
    for (k, (ranks, replicas, losses)) in curves.iter().enumerate() {
        let color = colors[k % colors.len()];
        let series = chart
            .draw_series(LineSeries::new(
                losses.iter().enumerate().map(|(i, &l)| (i, l)),
                color.stroke_width(2),
            ))
            .map_err(err)?;
        if labels {
            let label = if *replicas > 1 {
                format!("{ranks} ranks, {replicas} data-parallel replicas")
            } else {
                format!("{ranks} rank(s)")
            };
            series
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
    }
    if labels {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    drop(chart);
    drop(root);
    if !labels {
        println!(
            "rank 0: no font at {}: the picture has no labels",
            font.display()
        );
    }
    Ok(png)
}
