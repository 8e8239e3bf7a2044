//! Analyzers for tests: they count their calls, and can be held at a gate that the test
//! opens, or fail.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use pgtaskd::analyzer::{AnalyzeError, Analyzer, Counts, TextStats};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{within, WAIT};

/// The real analyzer behind a gate, with a count of every call by payload.
pub struct GatedAnalyzer {
    open: Mutex<bool>,
    opened: Condvar,
    /// Whether a held analyzer gives up when its cancellation token fires.
    honors_cancel: bool,
    /// Fail every call with this message (after passing the gate), with partial counts.
    fails_with: Option<String>,
    /// Hold only the texts that contain this marker; the others pass at once.
    holds_only: Option<String>,
    calls: Mutex<HashMap<String, usize>>,
    returns: Mutex<HashMap<String, usize>>,
    entered: watch::Sender<usize>,
    returned: watch::Sender<usize>,
    /// Calls that saw their cancellation token fire while held.
    cancel_seen: watch::Sender<usize>,
}

impl GatedAnalyzer {
    fn build(open: bool, honors_cancel: bool, fails_with: Option<String>) -> Arc<Self> {
        Arc::new(GatedAnalyzer {
            open: Mutex::new(open),
            opened: Condvar::new(),
            honors_cancel,
            fails_with,
            holds_only: None,
            calls: Mutex::new(HashMap::new()),
            returns: Mutex::new(HashMap::new()),
            entered: watch::channel(0).0,
            returned: watch::channel(0).0,
            cancel_seen: watch::channel(0).0,
        })
    }

    /// Never held: only counts.
    pub fn counting() -> Arc<Self> {
        GatedAnalyzer::build(true, true, None)
    }

    /// Held until [`GatedAnalyzer::open`]; gives up early when canceled.
    pub fn closed() -> Arc<Self> {
        GatedAnalyzer::build(false, true, None)
    }

    /// Held until [`GatedAnalyzer::open`], whatever its cancellation token says.
    pub fn closed_ignoring_cancel() -> Arc<Self> {
        GatedAnalyzer::build(false, false, None)
    }

    /// Held until [`GatedAnalyzer::open`] for texts that contain `marker` (giving up early
    /// when canceled); every other text passes at once.
    pub fn holding_only(marker: &str) -> Arc<Self> {
        let mut analyzer = GatedAnalyzer::build(false, true, None);
        Arc::get_mut(&mut analyzer).expect("just built").holds_only = Some(marker.to_string());
        analyzer
    }

    /// Every call fails with `message`, carrying the counts it had reached.
    pub fn failing(message: &str) -> Arc<Self> {
        GatedAnalyzer::build(true, true, Some(message.to_string()))
    }

    /// Let every held and future call through.
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    /// A guard that opens the gate when dropped, so that a failing test does not leave
    /// analyzers held (and its runtime waiting for them) forever.
    pub fn open_on_drop(self: &Arc<Self>) -> OpenOnDrop {
        OpenOnDrop(Arc::clone(self))
    }

    /// How many calls there were for `payload`.
    pub fn calls_for(&self, payload: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .get(payload)
            .copied()
            .unwrap_or(0)
    }

    /// How many calls for `payload` have returned.
    pub fn returns_for(&self, payload: &str) -> usize {
        self.returns
            .lock()
            .unwrap()
            .get(payload)
            .copied()
            .unwrap_or(0)
    }

    /// How many calls there were in all.
    pub fn calls(&self) -> usize {
        self.calls.lock().unwrap().values().sum()
    }

    /// The largest number of calls any one payload had.
    pub fn most_calls_for_one_payload(&self) -> usize {
        self.calls
            .lock()
            .unwrap()
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// Wait until `n` calls in all have entered the analyzer.
    pub async fn entered(&self, n: usize) {
        let mut rx = self.entered.subscribe();
        within(
            WAIT,
            &format!("{n} analyzer calls to start"),
            rx.wait_for(|&c| c >= n),
        )
        .await
        .expect("the analyzer outlives the test");
    }

    /// Wait until `n` calls in all have returned from the analyzer.
    pub async fn returned(&self, n: usize) {
        let mut rx = self.returned.subscribe();
        within(
            WAIT,
            &format!("{n} analyzer calls to return"),
            rx.wait_for(|&c| c >= n),
        )
        .await
        .expect("the analyzer outlives the test");
    }

    /// Wait until `n` held calls have seen their cancellation token fire.
    pub async fn saw_cancel(&self, n: usize) {
        let mut rx = self.cancel_seen.subscribe();
        within(
            WAIT,
            &format!("{n} analyzer calls to see a cancel"),
            rx.wait_for(|&c| c >= n),
        )
        .await
        .expect("the analyzer outlives the test");
    }

    /// How many held calls have seen their cancellation token fire so far.
    pub fn saw_cancel_now(&self) -> usize {
        *self.cancel_seen.borrow()
    }

    /// How many calls have returned.
    pub fn returned_now(&self) -> usize {
        *self.returned.borrow()
    }

    fn pass_gate(&self, cancel: &CancellationToken) -> bool {
        let mut open = self.open.lock().unwrap();
        let mut seen = false;
        while !*open {
            if cancel.is_cancelled() && !seen {
                seen = true;
                self.cancel_seen.send_modify(|c| *c += 1);
            }
            if self.honors_cancel && seen {
                return false;
            }
            open = self
                .opened
                .wait_timeout(open, Duration::from_millis(5))
                .unwrap()
                .0;
        }
        true
    }
}

/// Opens its analyzer's gate when dropped.
pub struct OpenOnDrop(Arc<GatedAnalyzer>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl Analyzer for GatedAnalyzer {
    fn analyze(&self, text: &str, cancel: &CancellationToken) -> Result<Counts, AnalyzeError> {
        *self
            .calls
            .lock()
            .unwrap()
            .entry(text.to_string())
            .or_default() += 1;
        self.entered.send_modify(|c| *c += 1);
        let held = match &self.holds_only {
            Some(marker) => text.contains(marker.as_str()),
            None => true,
        };
        let result = if held && !self.pass_gate(cancel) {
            Err(AnalyzeError::Canceled {
                partial: Counts::default(),
            })
        } else if let Some(message) = &self.fails_with {
            Err(AnalyzeError::Failed {
                message: message.clone(),
                partial: pgtaskd::analyzer::analyze(text),
            })
        } else if self.honors_cancel {
            TextStats.analyze(text, cancel)
        } else {
            Ok(pgtaskd::analyzer::analyze(text))
        };
        *self
            .returns
            .lock()
            .unwrap()
            .entry(text.to_string())
            .or_default() += 1;
        self.returned.send_modify(|c| *c += 1);
        result
    }
}
