//! Quoting what a server or a caller sent in an error message: at most
//! [`Clipped::LIMIT`] bytes, so a reply of megabytes or a key of garbage cannot flood a
//! log. Every service crate quotes through it.

use core::fmt;

/// `text`, displayed cut to at most [`Clipped::LIMIT`] bytes on a character boundary,
/// with `…` after a cut.
///
/// ```
/// use leasehold_driver::Clipped;
/// assert_eq!(Clipped("short").to_string(), "short");
/// let long = "é".repeat(300);
/// let shown = Clipped(&long).to_string();
/// assert!(shown.ends_with('…') && shown.len() <= Clipped::LIMIT + '…'.len_utf8());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Clipped<'a>(pub &'a str);

impl Clipped<'_> {
    /// The most bytes of the text shown.
    pub const LIMIT: usize = 200;
}

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0;
        if text.len() <= Self::LIMIT {
            return f.write_str(text);
        }
        let mut cut = Self::LIMIT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        f.write_str(text.get(..cut).unwrap_or_default())?;
        f.write_str("…")
    }
}
