//! Names of allocations as people group them: labels and tensor names that differ only in the
//! numbers indexing a layer or a chunk are one group (`compare`, `report` and `diff` share it).

/// `layer.12.kv.chunk.3` → `layer.#.kv.chunk.#`: allocations that differ only in their
/// numbers (one per layer, per chunk) are one group. Only a number that is a whole part of the
/// name (between separators such as `.`, `/`, `_`, `-`, `:` or the ends) is an index; digits
/// inside a word (`l2norm`, `fp32`, `bf16`) are part of the word.
pub fn pattern(s: &str) -> String {
    let is_sep = |c: char| !c.is_alphanumeric();
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if c.is_ascii_digit() && out.chars().next_back().is_none_or(is_sep) {
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if rest[end..].chars().next().is_none_or(is_sep) {
                out.push('#');
                rest = &rest[end..];
                continue;
            }
            out.push_str(&rest[..end]);
            rest = &rest[end..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::pattern;

    #[test]
    fn numbers_become_one_placeholder() {
        assert_eq!(pattern("layer.12.kv.chunk.3"), "layer.#.kv.chunk.#");
        assert_eq!(
            pattern("prefill/chunk.27/layer.0/gdn/inputs"),
            "prefill/chunk.#/layer.#/gdn/inputs"
        );
        assert_eq!(pattern("lm_head"), "lm_head");
        assert_eq!(pattern("3"), "#");
        assert_eq!(pattern("layer_3-4:5"), "layer_#-#:#");
    }

    #[test]
    fn digits_inside_a_word_are_kept() {
        assert_eq!(pattern("l2norm"), "l2norm");
        assert_eq!(
            pattern("layer.3/gdn/l2norm_fwd/q_fp32"),
            "layer.#/gdn/l2norm_fwd/q_fp32"
        );
        assert_eq!(pattern("2d.buf"), "2d.buf");
        assert_eq!(pattern("bf16[4, 8]"), "bf16[#, #]");
    }
}
