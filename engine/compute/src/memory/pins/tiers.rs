//! The orders in which pins give RAM back (§7.5, HEAD) and give their registration up (§7.4, #15226).
//!
//! A tier names the subsets and the models it covers; within a tier models go oldest-loaded first, each
//! model's subsets in the tier's order, each subset from the top of its stack (most recent pin first).

use super::Subset;

/// One step of an eviction order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tier {
    /// Subsets, in the order they are walked within a model.
    pub(super) subsets: &'static [Subset],
    /// `Some(b)`: models whose "in the current prompt" flag is `b`; `None`: any.
    pub(super) in_prompt: Option<bool>,
    /// Whether the tier covers active models (else inactive ones).
    pub(super) active: bool,
}

impl Tier {
    /// Whether a model with these flags is in the tier.
    pub(super) fn covers(&self, in_prompt: bool, active: bool) -> bool {
        self.active == active && self.in_prompt.is_none_or(|p| p == in_prompt)
    }
}

const PLAIN: &[Subset] = &[Subset::Weights, Subset::Patches];
const LOADED: &[Subset] = &[Subset::WeightsLoaded, Subset::PatchesLoaded];

/// Where freed RAM comes from (`free_pins`), HEAD order:
/// 1. `weights`/`patches` of models not in the current prompt;
/// 2. `*-loaded` (RAM copies of VRAM-resident weights) of models not in the prompt;
/// 3. `*-loaded` of inactive models in the prompt;
/// 4. `weights`/`patches` of inactive models in the prompt — skipped when the request is for a `-loaded`
///    pin: an MRU copy of a resident weight never displaces a pin the prompt streams from;
/// 5. with `evict_active`, active models: their `*-loaded`, then (not for a `-loaded` request) their
///    `weights`/`patches`.
///
/// Tiers 1–4 cover inactive models only (a model not in the prompt is never active).
pub(super) fn free_tiers(loaded: bool, evict_active: bool) -> Vec<Tier> {
    let mut tiers = vec![
        Tier { subsets: PLAIN, in_prompt: Some(false), active: false },
        Tier { subsets: LOADED, in_prompt: Some(false), active: false },
        Tier { subsets: LOADED, in_prompt: Some(true), active: false },
    ];
    if !loaded {
        tiers.push(Tier { subsets: PLAIN, in_prompt: Some(true), active: false });
    }
    if evict_active {
        tiers.push(Tier { subsets: LOADED, in_prompt: None, active: true });
        if !loaded {
            tiers.push(Tier { subsets: PLAIN, in_prompt: None, active: true });
        }
    }
    tiers
}

/// Whose registrations are given up first (`free_registrations`, #15226): inactive models not in the prompt,
/// inactive models in it, then with `evict_active` active models not in the prompt and active models in it.
/// Within a model the `*-loaded` subsets go first, as in [`free_tiers`].
pub(super) fn registration_tiers(evict_active: bool) -> Vec<Tier> {
    let mut tiers = vec![
        Tier { subsets: &Subset::ALL, in_prompt: Some(false), active: false },
        Tier { subsets: &Subset::ALL, in_prompt: Some(true), active: false },
    ];
    if evict_active {
        tiers.push(Tier { subsets: &Subset::ALL, in_prompt: Some(false), active: true });
        tiers.push(Tier { subsets: &Subset::ALL, in_prompt: Some(true), active: true });
    }
    tiers
}
