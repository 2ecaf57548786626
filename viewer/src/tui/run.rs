//! The event loop and the terminal it runs in.

use std::io;
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::Backend;
use ratatui::crossterm::event::{self, Event, KeyEvent, KeyEventKind};

use crate::error::ViewerError;
use crate::tui::LiveSource;
use crate::tui::app::{Action, App, Mode, ViewOptions};

/// Settings of [`run`].
#[derive(Debug, Clone, PartialEq)]
pub struct RunOptions {
    /// Settings of the view itself.
    pub view: ViewOptions,
    /// Time between polls of the source (and frames when no key is pressed).
    pub tick: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            view: ViewOptions::default(),
            tick: Duration::from_millis(100),
        }
    }
}

/// Key presses, waited for with a timeout; the terminal in [`run`], a script in tests.
pub trait KeyInput {
    /// The next key press, or `None` if none came within `timeout`.
    fn next_key(&mut self, timeout: Duration) -> io::Result<Option<KeyEvent>>;
}

/// Keys from the terminal through crossterm.
#[derive(Debug, Default)]
pub struct TerminalKeys;

impl KeyInput for TerminalKeys {
    fn next_key(&mut self, timeout: Duration) -> io::Result<Option<KeyEvent>> {
        if !event::poll(timeout)? {
            return Ok(None);
        }
        match event::read()? {
            Event::Key(key) if key.kind == KeyEventKind::Press => Ok(Some(key)),
            // Resizes and the rest just cause a redraw.
            _ => Ok(None),
        }
    }
}

/// Restores the terminal when dropped: on return and on `?`.
struct RestoreTerminal;

impl Drop for RestoreTerminal {
    fn drop(&mut self) {
        // While unwinding, ratatui's panic hook has already restored the
        // terminal before printing the message; leaving the alternate screen
        // a second time would move the cursor back above that message.
        if !std::thread::panicking() {
            ratatui::restore();
        }
    }
}

/// Runs the live view in this terminal until the user quits.
///
/// The terminal is switched to raw mode and the alternate screen, and put
/// back on every way out: a normal quit, an error (restored before it is
/// returned) and a panic (a hook restores it before the message is printed).
pub fn run(source: &mut dyn LiveSource, options: &RunOptions) -> Result<(), ViewerError> {
    let restore = RestoreTerminal;
    // Also installs a panic hook that restores the terminal before printing.
    let mut terminal = ratatui::try_init().map_err(ViewerError::Terminal)?;
    let mut app = App::new(options.view.clone());
    let result = run_loop(
        &mut terminal,
        source,
        &mut app,
        &mut TerminalKeys,
        options.tick,
    );
    drop(restore);
    result
}

/// The loop of [`run`] on any backend: draw, wait for a key until the next
/// tick is due, then on each tick poll the source, advance the app and fetch
/// the snapshot at the cursor when the cursor or the data moved. Returns when
/// a key asks to quit.
pub fn run_loop<B: Backend>(
    terminal: &mut Terminal<B>,
    source: &mut dyn LiveSource,
    app: &mut App,
    keys: &mut dyn KeyInput,
    tick: Duration,
) -> Result<(), ViewerError>
where
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let mut last_tick = Instant::now();
    let mut asked = None;
    // The first tick comes at once so the first frame has data.
    let mut due = true;
    loop {
        if due {
            let updates = source.poll();
            let moved = !updates.is_empty();
            app.apply(updates);
            app.tick();
            last_tick = Instant::now();
            let query = app.snapshot_query();
            if query != asked || (moved && app.mode() == Mode::Follow) {
                let snapshot = query.as_ref().and_then(|q| source.snapshot(q));
                app.set_snapshot(snapshot);
                asked = query;
            }
        }
        terminal
            .draw(|frame| frame.render_widget(&*app, frame.area()))
            .map_err(|e| ViewerError::Draw(Box::new(e)))?;
        let timeout = tick.saturating_sub(last_tick.elapsed());
        if let Some(key) = keys.next_key(timeout).map_err(ViewerError::Terminal)?
            && app.on_key(key) == Action::Quit
        {
            return Ok(());
        }
        due = last_tick.elapsed() >= tick;
        // A key that moved the cursor needs its snapshot now, not at the next tick.
        if !due && app.snapshot_query() != asked {
            let query = app.snapshot_query();
            let snapshot = query.as_ref().and_then(|q| source.snapshot(q));
            app.set_snapshot(snapshot);
            asked = query;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::{KeyCode, KeyModifiers};

    use super::*;
    use crate::model::{LiveSnapshot, TimelinePoint, Update};
    use crate::tui::ScriptedSource;

    /// Keys from a script; `None` entries are timeouts (a tick passes).
    struct ScriptedKeys(VecDeque<Option<KeyCode>>);

    impl KeyInput for ScriptedKeys {
        fn next_key(&mut self, _timeout: Duration) -> io::Result<Option<KeyEvent>> {
            match self.0.pop_front() {
                Some(code) => Ok(code.map(|c| KeyEvent::new(c, KeyModifiers::NONE))),
                None => Err(io::Error::other("the script ran out of keys")),
            }
        }
    }

    #[test]
    fn loop_polls_draws_queries_and_quits() {
        let sample = |t: f64, b| Update::Sample {
            device: 0,
            point: TimelinePoint::new(t, b),
        };
        let mut source = ScriptedSource::new(vec![
            vec![sample(0.0, 10), sample(1.0, 50)],
            vec![sample(2.0, 20)],
        ])
        .with_snapshots(vec![LiveSnapshot {
            time_s: 1.0,
            ..Default::default()
        }]);
        let mut app = App::new(ViewOptions::default());
        let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
        // A zero tick makes every pass a tick, so the script decides the pace.
        let mut keys =
            ScriptedKeys([None, Some(KeyCode::Char('p')), Some(KeyCode::Char('q'))].into());
        run_loop(
            &mut terminal,
            &mut source,
            &mut app,
            &mut keys,
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(source.remaining(), 0);
        assert_eq!(app.mode(), Mode::Paused);
        assert_eq!(app.cursor_time(), 1.0);
        let times: Vec<f64> = source.queries().iter().map(|q| q.time_s).collect();
        // Follow at 1 s, follow at 2 s after the second batch, then the peak at 1 s.
        assert_eq!(times, [1.0, 2.0, 1.0]);
        assert_eq!(app.snapshot().map(|s| s.time_s), Some(1.0));
    }

    #[test]
    fn loop_returns_key_errors() {
        let mut source = ScriptedSource::default();
        let mut app = App::new(ViewOptions::default());
        let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
        let err = run_loop(
            &mut terminal,
            &mut source,
            &mut app,
            &mut ScriptedKeys(VecDeque::new()),
            Duration::ZERO,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("the script ran out of keys"),
            "{err}"
        );
    }
}
