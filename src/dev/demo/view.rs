//! The live view: a [`Snapshot`] of the pipeline each second, drawn with
//! ratatui when stdout is a terminal, else printed as a plain table every
//! few seconds (CI logs, a pipe).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::DefaultTerminal;
use tokio::sync::mpsc;

/// One seller's row.
#[derive(Debug, Clone, Default)]
pub struct SellerRow {
    pub seller: String,
    pub role: &'static str,
    pub rule: String,
    /// Sustained jobs/s its rule allows.
    pub limit_per_sec: f64,
    /// Calls per second at the stub, over the last two seconds.
    pub rate_per_sec: f64,
    pub calls: u64,
    pub throttled_429: u64,
    pub waiting_limit: f64,
    pub waiting_capacity: f64,
    pub dead: usize,
}

/// The pipeline at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// What the demo is doing, and since when: "load 12 s of 45 s",
    /// "draining (3 of 15 s)", ...
    pub phase: String,
    pub produced: u64,
    pub to_produce: u64,
    pub replicas: usize,
    pub replicas_up: usize,
    pub rows: Vec<SellerRow>,
    pub parked: f64,
    pub to_retry: f64,
    pub in_flight: f64,
    pub lag_jobs: f64,
    pub lag_retry: f64,
    pub lag_seconds: f64,
    pub dead_total: usize,
    pub dead_reasons: Vec<(String, usize)>,
    /// Anything wrong worth a line (a replica down).
    pub notes: Vec<String>,
    pub logs: String,
}

impl Snapshot {
    fn header(&self) -> String {
        format!(
            "{} | produced {}/{} | replicas {}/{} up | logs {}",
            self.phase, self.produced, self.to_produce, self.replicas_up, self.replicas, self.logs
        )
    }

    fn footer(&self) -> Vec<String> {
        let mut lines = vec![
            format!(
                "lag: jobs topic {:.0} msgs, retry tiers {:.0} msgs, oldest unfinished {:.1}s | in flight {:.0}",
                self.lag_jobs, self.lag_retry, self.lag_seconds, self.in_flight
            ),
            format!(
                "retry topic: {:.0} parked now (all sellers; the metric has no seller label), {:.0} sent so far",
                self.parked, self.to_retry
            ),
        ];
        lines.push(format!(
            "dead-lettered: {}{}",
            self.dead_total,
            if self.dead_reasons.is_empty() {
                ""
            } else {
                ", by reason:"
            }
        ));
        for (r, n) in &self.dead_reasons {
            lines.push(format!("  {n:>5}  {r}"));
        }
        lines.extend(self.notes.iter().cloned());
        lines
    }
}

const COLUMNS: [&str; 10] = [
    "seller",
    "role",
    "rule",
    "limit/s",
    "calls/s",
    "calls",
    "429s",
    "wait:limit",
    "wait:capacity",
    "dead",
];

fn cells(r: &SellerRow) -> [String; 10] {
    [
        r.seller.clone(),
        r.role.to_owned(),
        r.rule.clone(),
        format!("{:.0}", r.limit_per_sec),
        format!("{:.0}", r.rate_per_sec),
        r.calls.to_string(),
        r.throttled_429.to_string(),
        format!("{:.0}", r.waiting_limit),
        format!("{:.0}", r.waiting_capacity),
        r.dead.to_string(),
    ]
}

/// The snapshot as a plain text table.
pub fn plain(s: &Snapshot) -> String {
    let rows: Vec<[String; 10]> = s.rows.iter().map(cells).collect();
    let mut widths: Vec<usize> = COLUMNS.iter().map(|c| c.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                // Text columns left, numbers right.
                if i < 3 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = String::new();
    out.push_str(&s.header());
    out.push('\n');
    let head: Vec<String> = COLUMNS.iter().map(|c| c.to_string()).collect();
    out.push_str(&line(&head));
    out.push('\n');
    for r in &rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    for f in s.footer() {
        out.push_str(&f);
        out.push('\n');
    }
    out
}

/// Where snapshots go.
pub enum View {
    Plain {
        /// Reprint every this many snapshots (one a second).
        every: u32,
        seen: u32,
    },
    Tui(Tui),
}

impl View {
    /// ratatui on a terminal, the plain table otherwise. `stop` gets a
    /// message when the user presses q, Esc or Ctrl-C in the terminal view
    /// (raw mode turns Ctrl-C into a key, not a signal).
    pub fn open(stop: mpsc::UnboundedSender<()>) -> View {
        if std::io::stdout().is_terminal() {
            match Tui::start(stop) {
                Ok(t) => return View::Tui(t),
                Err(e) => eprintln!("no terminal view ({e}); printing a table instead"),
            }
        }
        View::Plain { every: 3, seen: 0 }
    }

    pub fn show(&mut self, s: &Snapshot) {
        match self {
            View::Plain { every, seen } => {
                if *seen % *every == 0 {
                    println!("{}", plain(s));
                }
                *seen += 1;
            }
            View::Tui(t) => t.draw(s),
        }
    }

    /// Gives the terminal back (the summary is printed after this).
    pub fn close(self) {}
}

/// The terminal view; restores the terminal when dropped.
pub struct Tui {
    terminal: DefaultTerminal,
    done: Arc<AtomicBool>,
    keys: Option<std::thread::JoinHandle<()>>,
}

impl Tui {
    fn start(stop: mpsc::UnboundedSender<()>) -> std::io::Result<Tui> {
        let terminal = ratatui::try_init()?;
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let keys = std::thread::Builder::new()
            .name("demo-keys".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    let Ok(true) = event::poll(Duration::from_millis(200)) else {
                        continue;
                    };
                    let Ok(Event::Key(k)) = event::read() else {
                        continue;
                    };
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if k.kind == KeyEventKind::Press
                        && (ctrl_c || matches!(k.code, KeyCode::Char('q') | KeyCode::Esc))
                    {
                        let _ = stop.send(());
                        return;
                    }
                }
            })?;
        Ok(Tui {
            terminal,
            done,
            keys: Some(keys),
        })
    }

    fn draw(&mut self, s: &Snapshot) {
        let header = s.header();
        let footer = s.footer();
        let rows: Vec<Row> = s
            .rows
            .iter()
            .map(|r| {
                let held = r.waiting_limit > 0.0 || r.throttled_429 > 0;
                let style = if held {
                    Style::default().fg(Color::Yellow)
                } else {
                    Style::default()
                };
                Row::new(cells(r).to_vec()).style(style)
            })
            .collect();
        let widths = [
            Constraint::Length(10),
            Constraint::Length(11),
            Constraint::Length(42),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(6),
            Constraint::Length(10),
            Constraint::Length(13),
            Constraint::Length(5),
        ];
        let table = Table::new(rows, widths)
            .header(
                Row::new(COLUMNS.to_vec()).style(Style::default().add_modifier(Modifier::BOLD)),
            )
            .block(Block::bordered().title(
                " per seller: calls/s at the stub against its limit; waiting by cause (limit, capacity) ",
            ));
        let foot: Vec<Line> = footer.into_iter().map(Line::from).collect();
        let foot_height = foot.len() as u16 + 2;
        // The table as tall as its rows (header and borders: 3 lines), the
        // totals right below it.
        let table_height = s.rows.len() as u16 + 3;
        let _ = self.terminal.draw(|f| {
            let [top, middle, bottom, help, _] = Layout::vertical([
                Constraint::Length(1),
                Constraint::Length(table_height),
                Constraint::Length(foot_height),
                Constraint::Length(1),
                Constraint::Min(0),
            ])
            .areas(f.area());
            f.render_widget(Paragraph::new(header), top);
            f.render_widget(table, middle);
            f.render_widget(Paragraph::new(foot).block(Block::bordered()), bottom);
            f.render_widget(
                Paragraph::new("q, Esc or Ctrl-C: stop the demo (no summary)"),
                help,
            );
        });
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(k) = self.keys.take() {
            let _ = k.join();
        }
        ratatui::restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_table_has_a_row_per_seller_and_the_totals() {
        let s = Snapshot {
            phase: "load 12 s of 45 s".into(),
            produced: 3600,
            to_produce: 9000,
            replicas: 3,
            replicas_up: 3,
            rows: vec![
                SellerRow {
                    seller: "seller-0".into(),
                    role: "bulk tier",
                    rule: "token_bucket 72/1s burst 144".into(),
                    limit_per_sec: 72.0,
                    rate_per_sec: 71.5,
                    calls: 800,
                    throttled_429: 0,
                    waiting_limit: 130.0,
                    waiting_capacity: 2.0,
                    dead: 4,
                },
                SellerRow {
                    seller: "seller-11".into(),
                    ..Default::default()
                },
            ],
            parked: 17.0,
            to_retry: 40.0,
            lag_jobs: 140.0,
            dead_total: 4,
            dead_reasons: vec![("not JSON".into(), 4)],
            logs: "/tmp/x".into(),
            ..Default::default()
        };
        let text = plain(&s);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("load 12 s of 45 s | produced 3600/9000 | replicas 3/3 up"),
            "{text}"
        );
        assert!(lines[1].starts_with("seller   "), "{text}");
        assert!(lines[2].starts_with("seller-0 "), "{text}");
        assert!(lines[2].contains("token_bucket 72/1s burst 144"), "{text}");
        assert!(lines[2].ends_with("130              2     4"), "{text}");
        assert!(lines[3].starts_with("seller-11"), "{text}");
        assert!(text.contains("jobs topic 140 msgs"), "{text}");
        assert!(text.contains("17 parked now"), "{text}");
        assert!(
            text.contains("dead-lettered: 4, by reason:\n      4  not JSON\n"),
            "{text}"
        );
    }
}
