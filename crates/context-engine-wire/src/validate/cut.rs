//! Safe cut points: the boundaries every property of a profile allows.

use std::ops::Range;

use super::Profile;
use super::observation::TextActions;
use super::reentry::reentries_with;
use super::strict::{Side, join_ok};
use crate::message::Message;

/// The safe boundaries of one transcript, computed once in O(n) and then
/// queried cheaply by an engine deciding what to drop or summarize.
///
/// Boundary `i` (`0 <= i <= len`) is the gap before message `i`. It is safe
/// when no property of the profile forbids it (see [`super::Property`]); `0`
/// and `len` always are. Removing `a..b` between two safe boundaries keeps a
/// valid transcript valid under the OpenAI profile; under
/// [`Profile::Strict`] ask [`CutPoints::can_remove`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CutPoints {
    /// `safe[i]` for every boundary `0..=len`.
    safe: Vec<bool>,
    /// The safe boundaries, ascending (for nearest-boundary queries).
    list: Vec<usize>,
    /// Per-message sides, kept only for the strict profile's join check.
    sides: Option<Vec<Side>>,
}

impl CutPoints {
    /// Cut points under the OpenAI profile, text actions as `actions`.
    pub fn new(messages: &[Message], actions: &TextActions) -> CutPoints {
        CutPoints::with_profile(messages, Profile::OpenAi, actions)
    }

    /// Cut points under `profile`: the intersection of what each of its
    /// properties allows, and never before a tool re-entry (an envelope,
    /// or an observation under `actions`): a re-entry stays with the
    /// assistant turn before it, or its results would reach the model
    /// without the calls that produced them.
    pub fn with_profile(
        messages: &[Message],
        profile: Profile,
        actions: &TextActions,
    ) -> CutPoints {
        let mut forbidden = vec![false; messages.len() + 1];
        for property in profile.properties() {
            property.forbid(messages, &mut forbidden);
        }
        for (i, reentry) in reentries_with(messages, actions).into_iter().enumerate() {
            if reentry && let Some(slot) = forbidden.get_mut(i) {
                *slot = true;
            }
        }
        let sides = (profile == Profile::Strict).then(|| messages.iter().map(Side::of).collect());
        CutPoints::from_forbidden(forbidden, sides)
    }

    /// Cut points from the boundaries the rules forbid (`len + 1` entries;
    /// the two ends are always allowed) and, for formats that alternate
    /// roles, each message's side.
    pub(crate) fn from_forbidden(mut forbidden: Vec<bool>, sides: Option<Vec<Side>>) -> CutPoints {
        if forbidden.is_empty() {
            forbidden.push(false);
        }
        let last = forbidden.len() - 1;
        forbidden[0] = false;
        forbidden[last] = false;
        let safe: Vec<bool> = forbidden.into_iter().map(|f| !f).collect();
        let list = safe
            .iter()
            .enumerate()
            .filter_map(|(i, ok)| ok.then_some(i))
            .collect();
        CutPoints { safe, list, sides }
    }

    /// Number of messages in the transcript (the last boundary).
    pub fn len(&self) -> usize {
        self.safe.len() - 1
    }

    /// Whether the transcript has no messages.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a kept tail may start at message `i` and a kept head may end
    /// just before it. False for `i > len`.
    pub fn is_safe(&self, i: usize) -> bool {
        self.safe.get(i).copied().unwrap_or(false)
    }

    /// The nearest safe boundary at or before `i` (`i` past the end counts as
    /// `len`). Always exists, since `0` is safe.
    pub fn at_or_before(&self, i: usize) -> usize {
        let i = i.min(self.len());
        // Index of the first safe boundary > i; the one before it is <= i.
        let after = self.list.partition_point(|&b| b <= i);
        after
            .checked_sub(1)
            .and_then(|k| self.list.get(k))
            .copied()
            .unwrap_or(0)
    }

    /// The nearest safe boundary at or after `i`; `len` when `i` is past the
    /// end. Always exists, since `len` is safe.
    pub fn at_or_after(&self, i: usize) -> usize {
        let k = self.list.partition_point(|&b| b < i);
        self.list.get(k).copied().unwrap_or(self.len())
    }

    /// Every safe boundary, ascending; starts with `0`, ends with `len`.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        self.list.iter().copied()
    }

    /// The atomic groups: the message ranges between consecutive safe
    /// boundaries, which together cover the transcript in order. An engine
    /// keeps or drops each group whole.
    pub fn groups(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.list.windows(2).map(|w| w[0]..w[1])
    }

    /// Whether removing messages `a..b` (keeping `..a` and `b..`) keeps a
    /// valid transcript valid under this profile: `a <= b <= len`, both
    /// boundaries safe, and, under the strict profile, the two messages that
    /// meet at the join may follow each other.
    pub fn can_remove(&self, a: usize, b: usize) -> bool {
        if a > b || !self.is_safe(a) || !self.is_safe(b) {
            return false;
        }
        match &self.sides {
            Some(sides) if a < b => join_ok(sides, a, b),
            _ => true,
        }
    }
}

/// The atomic groups of `messages` under the OpenAI profile (see
/// [`CutPoints::groups`]).
pub fn atomic_groups(messages: &[Message], actions: &TextActions) -> Vec<Range<usize>> {
    CutPoints::new(messages, actions).groups().collect()
}
