//! How the driver runs compaction.

use std::collections::BTreeMap;

use crate::validate::Profile;

/// How the driver runs compaction; defaults follow the reference host.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct HostOptions {
    /// Compaction passes per trigger: a pass that still leaves the prompt
    /// over the threshold may be followed by another, up to this many.
    pub max_passes: u32,
    /// A pass that saves less than this share of the prompt ends the loop:
    /// another would thrash (summaries of summaries) for nothing.
    pub min_pass_savings: f64,
    /// Provider rules every engine output must keep (no new violations).
    pub profile: Profile,
    /// Summaries are prepared in the background from this share of the
    /// threshold on ([`Session::summary_job`]), and an automatic compaction
    /// never waits for a summary model: it uses the prepared summary when
    /// it is ready; when not, the request goes out as selected (the
    /// digest), and only a request over the window is compacted with the
    /// deterministic extractive summary. `None` (the default): the
    /// summarizer runs inline, when the threshold is crossed.
    pub summary_watermark: Option<f64>,
    /// Context windows by model-name substring (or `provider:substring`),
    /// for hosts whose requests name their model
    /// ([`Session::use_model`]); a model no key matches gets the engine's
    /// own window.
    pub model_windows: BTreeMap<String, u64>,
    /// Which user messages are a text-action agent's tool output
    /// (`context.text_actions`): where a fitted request may place its note.
    pub text_actions: crate::validate::TextActions,
}

impl Default for HostOptions {
    fn default() -> HostOptions {
        HostOptions {
            max_passes: 3,
            min_pass_savings: 0.05,
            profile: Profile::OpenAi,
            summary_watermark: None,
            model_windows: BTreeMap::new(),
            text_actions: crate::validate::TextActions::default(),
        }
    }
}

impl HostOptions {
    /// Sets [`profile`](Self::profile).
    pub fn with_profile(mut self, profile: Profile) -> HostOptions {
        self.profile = profile;
        self
    }

    /// Sets [`text_actions`](Self::text_actions).
    pub fn with_text_actions(mut self, actions: crate::validate::TextActions) -> HostOptions {
        self.text_actions = actions;
        self
    }

    /// Sets [`summary_watermark`](Self::summary_watermark).
    pub fn with_summary_watermark(mut self, watermark: Option<f64>) -> HostOptions {
        self.summary_watermark = watermark;
        self
    }

    /// Sets [`model_windows`](Self::model_windows).
    pub fn with_model_windows(mut self, windows: BTreeMap<String, u64>) -> HostOptions {
        self.model_windows = windows;
        self
    }

    /// Sets [`max_passes`](Self::max_passes).
    pub fn with_max_passes(mut self, passes: u32) -> HostOptions {
        self.max_passes = passes;
        self
    }
}
