//! The report as one self-contained HTML file: the Markdown rendered with GitHub's extensions
//! (tables, strikethrough), the plots inline as base64 data URIs, a small style sheet.

use base64::Engine as _;
use pulldown_cmark::{Options, Parser, html};

/// A `data:` URI holding a PNG.
pub fn png_data_uri(png: &[u8]) -> String {
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    )
}

const STYLE: &str = "body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45;color:#1f2328}\
table{border-collapse:collapse;margin:0.5em 0}th,td{border:1px solid #d0d7de;padding:3px 8px}\
th{background:#f6f8fa}code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:90%}\
pre{background:#f6f8fa;padding:8px;overflow-x:auto}img{max-width:100%}summary{cursor:pointer}";

/// Renders `markdown` (whose images are already data URIs) as a whole HTML document.
pub fn render(title: &str, markdown: &str) -> String {
    let mut body = String::new();
    let opts = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH;
    html::push_html(&mut body, Parser::new_ext(markdown, opts));
    let title = title
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_uri_is_base64() {
        assert_eq!(png_data_uri(b"\x89PNG"), "data:image/png;base64,iVBORw==");
    }

    #[test]
    fn tables_and_details_render() {
        let h = render(
            "t",
            "| a | b |\n| --- | --- |\n| 1 | 2 |\n\n<details><summary>s</summary>\n\n```text\nat f\n```\n\n</details>\n",
        );
        assert!(h.contains("<table>"), "{h}");
        assert!(h.contains("<details><summary>s</summary>"), "{h}");
        assert!(
            h.contains("<pre><code class=\"language-text\">at f\n</code></pre>"),
            "{h}"
        );
    }
}
