//! Queues this daemon withholds from its claims: those it would run with the built-in
//! text-stats (it has no `[queues.NAME]` section for them) while another live daemon runs
//! them with an `exec` or `http` handler. Claiming them would mark their tasks SUCCEEDED with
//! word counts and never run their work. The daemon's presence (`src/maintenance/presence.rs`)
//! compares the handlers at each heartbeat and sets the list; every lane's claim leaves the
//! withheld queues out.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Mutex;

/// The queues withheld from claims now, shared by every lane and the presence.
#[derive(Debug, Default)]
pub struct Withheld {
    queues: Mutex<BTreeSet<String>>,
}

impl Withheld {
    /// Withhold exactly `queues` from now on; returns those newly withheld and those claimed
    /// again.
    pub fn set(&self, queues: BTreeSet<String>) -> (Vec<String>, Vec<String>) {
        let mut held = self.queues.lock().expect("withheld queues poisoned");
        let added = queues.difference(&held).cloned().collect();
        let removed = held.difference(&queues).cloned().collect();
        *held = queues;
        (added, removed)
    }

    /// The queues of `queues` that may be claimed now, in their order: `queues` itself, not
    /// a copy, while none is withheld (every claim asks).
    pub fn claimable<'a>(&self, queues: &'a [String]) -> Cow<'a, [String]> {
        let held = self.queues.lock().expect("withheld queues poisoned");
        if held.is_empty() {
            return Cow::Borrowed(queues);
        }
        Cow::Owned(
            queues
                .iter()
                .filter(|queue| !held.contains(*queue))
                .cloned()
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn withheld_queues_are_left_out_until_set_again() {
        let withheld = Withheld::default();
        let queues = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        assert!(matches!(withheld.claimable(&queues), Cow::Borrowed(q) if q == queues));
        let (added, removed) = withheld.set(["b".to_string()].into());
        assert_eq!((added, removed), (vec!["b".to_string()], vec![]));
        assert_eq!(*withheld.claimable(&queues), ["a", "c"]);
        let (added, removed) = withheld.set(BTreeSet::new());
        assert_eq!((added, removed), (vec![], vec!["b".to_string()]));
        assert_eq!(*withheld.claimable(&queues), queues);
    }
}
