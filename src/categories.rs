//! The categories of the stacked timeline, the live view's breakdown and the report: those of
//! the one categoriser ([`crate::categoriser`]), in its stacking order.
//!
//! Where only a label and an annotated name are at hand (an attribution's observed allocation),
//! [`category`] asks the categoriser with those alone; where the allocation's stack is known,
//! [`crate::categoriser::categorise_stack`] adds its Python frames and native modules.

pub use crate::categoriser::Category;
use crate::categoriser::{Facts, categorise};

/// How many categories there are.
pub const N: usize = Category::ALL.len();

/// The names of the categories shown to a person, in stacking order: index `i` is
/// [`Category::ALL`]`[i]`'s [`Category::title`], the one table of titles.
pub const CATEGORIES: [&str; N] = {
    let mut titles = [""; N];
    let mut i = 0;
    while i < N {
        titles[i] = Category::ALL[i].title();
        i += 1;
    }
    titles
};

/// The category of an allocation known only by its range label and annotated name.
pub fn category(label: Option<&str>, name: Option<&str>) -> Category {
    categorise(&Facts {
        label,
        name,
        ..Default::default()
    })
    .category
}

/// The category named `s`: a title (`KV cache`), a `report --json` key (`kv_cache`), or
/// `other`, the name the ballast's category had before there were twelve (`other processes`).
pub fn parse(s: &str) -> Option<Category> {
    Category::parse(s).or_else(|| {
        s.eq_ignore_ascii_case("other")
            .then_some(Category::OtherProcess)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_categorisers_titles_in_order() {
        for (i, c) in Category::ALL.into_iter().enumerate() {
            assert_eq!(CATEGORIES[i], c.title());
            assert_eq!(c.index(), i);
        }
    }

    #[test]
    fn names_parse() {
        assert_eq!(parse("other"), Some(Category::OtherProcess));
        assert_eq!(parse("other_process"), Some(Category::OtherProcess));
        assert_eq!(parse("allocator reserve"), Some(Category::AllocatorReserve));
        assert_eq!(parse("nonsense"), None);
    }

    #[test]
    fn labels_alone() {
        let c = |l: Option<&str>, n: Option<&str>| category(l, n).title();
        assert_eq!(
            c(Some("prefill/weights"), Some("layer.0.weights")),
            "weights"
        );
        assert_eq!(c(None, Some("embed_tokens")), "weights");
        assert_eq!(c(Some("prefill/kv_cache"), None), "KV cache");
        assert_eq!(
            c(Some("prefill/gdn_state"), Some("layer.3.ssm_state")),
            "recurrent state"
        );
        assert_eq!(
            c(Some("prefill/capacity"), Some("capacity ballast")),
            "other processes"
        );
        assert_eq!(
            c(
                Some("prefill/chunk.0/layer.3/gdn/inputs"),
                Some("initial_state")
            ),
            "recurrent state"
        );
        assert_eq!(c(Some("forward"), None), "activations");
        assert_eq!(c(None, None), "unnamed");
        assert_eq!(c(Some(""), Some("")), "unnamed");
    }
}
