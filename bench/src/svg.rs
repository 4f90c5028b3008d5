//! A timeline as an SVG file: one panel per quantity, time on the x axis. Hand-written SVG, no
//! dependencies: a few polylines, axes and labels.

use std::fmt::Write as _;

/// One line of a panel: its name and its (seconds, value) points.
pub struct Series {
    pub name: &'static str,
    pub points: Vec<(f64, f64)>,
}

/// One panel: a title with units, and its lines.
pub struct Panel {
    pub title: &'static str,
    pub series: Vec<Series>,
}

const W: f64 = 720.0;
const PANEL_H: f64 = 160.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// Renders the panels one under the other.
pub fn timeline(title: &str, panels: &[Panel]) -> String {
    let h = TOP + panels.len() as f64 * (PANEL_H + 50.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="14">{title}</text>"#
    );
    let t_max = panels
        .iter()
        .flat_map(|p| p.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)))
        .fold(1.0f64, f64::max);
    for (k, panel) in panels.iter().enumerate() {
        let y0 = TOP + k as f64 * (PANEL_H + 50.0) + 20.0;
        let v_max = panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            .max(1e-9);
        let pw = W - LEFT - 20.0;
        let _ = write!(
            s,
            r##"<text x="{LEFT}" y="{}">{}</text><rect x="{LEFT}" y="{y0}" width="{pw}" height="{PANEL_H}" fill="none" stroke="#999"/><text x="{}" y="{}" text-anchor="end">{:.3}</text><text x="{}" y="{}" text-anchor="end">0</text><text x="{}" y="{}" text-anchor="end">{:.0} s</text>"##,
            y0 - 6.0,
            panel.title,
            LEFT - 4.0,
            y0 + 10.0,
            v_max,
            LEFT - 4.0,
            y0 + PANEL_H,
            LEFT + pw,
            y0 + PANEL_H + 14.0,
            t_max
        );
        for (i, series) in panel.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<String> = series
                .points
                .iter()
                .map(|(t, v)| {
                    format!(
                        "{:.1},{:.1}",
                        LEFT + t / t_max * pw,
                        y0 + PANEL_H - v / v_max * PANEL_H
                    )
                })
                .collect();
            let _ = write!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/><text x="{}" y="{}" fill="{color}">{}</text>"#,
                pts.join(" "),
                LEFT + 10.0 + i as f64 * 140.0,
                y0 + PANEL_H + 28.0,
                series.name
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series() {
        let svg = timeline(
            "t",
            &[Panel {
                title: "echo (ms)",
                series: vec![Series {
                    name: "p50",
                    points: vec![(0.0, 1.0), (1.0, 2.0)],
                }],
            }],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("polyline") && svg.contains("p50"));
    }
}
