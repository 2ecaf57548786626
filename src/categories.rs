//! What an allocation holds, as one of a few categories: the stacks of the timeline, the rows
//! of the breakdown and of the report's live set.
//!
//! # The rule
//! [`category`] sorts an allocation by its range label (NVTX or annotation range) first, then by
//! its annotated name, lower-cased, by substring:
//! `weight`, `embed`, `lm_head`, `param` → weights; `kv`, `cache` (and in a label `_state`: the
//! recurrent state kept between chunks) → KV cache; `ballast`, `capacity`, `reserve` → other;
//! any other name → activations; no label and no name → unnamed.

/// One category. The order of [`Category::ALL`] is the stacking order of the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Category {
    /// Model weights and parameters.
    Weights,
    /// The KV cache, and recurrent state kept between chunks.
    KvCache,
    /// Any other named allocation.
    Activations,
    /// Ballast and reservations that stand in for memory the card does not have.
    Other,
    /// No label and no name.
    Unnamed,
}

impl Category {
    /// Every category, in stacking order (index `i` is [`CATEGORIES`]`[i]`).
    pub const ALL: [Category; 5] = [
        Category::Weights,
        Category::KvCache,
        Category::Activations,
        Category::Other,
        Category::Unnamed,
    ];

    /// The category's position in [`Category::ALL`] and [`CATEGORIES`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name shown for the category (as in [`CATEGORIES`]).
    pub fn name(self) -> &'static str {
        CATEGORIES[self.index()]
    }
}

/// The names of the categories, in stacking order.
pub const CATEGORIES: [&str; 5] = ["weights", "KV cache", "activations", "other", "unnamed"];

/// The category of an allocation with this range label and annotated name (see the module
/// documentation for the rule).
pub fn category(label: Option<&str>, name: Option<&str>) -> Category {
    const WEIGHTS: &[&str] = &["weight", "embed", "lm_head", "param"];
    const KV: &[&str] = &["kv", "cache"];
    const OTHER: &[&str] = &["ballast", "capacity", "reserve"];
    let label = label.filter(|s| !s.is_empty()).map(str::to_ascii_lowercase);
    let name = name.filter(|s| !s.is_empty()).map(str::to_ascii_lowercase);
    let has = |s: &Option<String>, words: &[&str]| {
        s.as_deref()
            .is_some_and(|s| words.iter().any(|w| s.contains(w)))
    };
    for s in [&label, &name] {
        if has(s, WEIGHTS) {
            return Category::Weights;
        }
        if has(s, KV) || (std::ptr::eq(s, &label) && has(s, &["_state"])) {
            return Category::KvCache;
        }
        if has(s, OTHER) {
            return Category::Other;
        }
    }
    if label.is_some() || name.is_some() {
        Category::Activations
    } else {
        Category::Unnamed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_follow_the_documented_rule() {
        let c = |l: Option<&str>, n: Option<&str>| category(l, n).name();
        assert_eq!(
            c(Some("prefill/weights"), Some("layer.0.weights")),
            "weights"
        );
        assert_eq!(c(None, Some("embed_tokens")), "weights");
        assert_eq!(c(Some("prefill/kv_cache"), None), "KV cache");
        assert_eq!(
            c(Some("prefill/gdn_state"), Some("layer.3.ssm_state")),
            "KV cache"
        );
        assert_eq!(
            c(Some("prefill/capacity"), Some("capacity ballast")),
            "other"
        );
        assert_eq!(
            c(
                Some("prefill/chunk.0/layer.3/gdn/inputs"),
                Some("initial_state")
            ),
            "activations"
        );
        assert_eq!(c(Some("forward"), None), "activations");
        assert_eq!(c(None, None), "unnamed");
        assert_eq!(c(Some(""), Some("")), "unnamed");
    }
}
