//! What `relay audit` prints is read on a terminal, and some of it was
//! written by strangers: a peer's error text, a route's URL, unknown members
//! of signed objects. [`SafeWriter`] sits between every audit output and
//! stdout and writes each control character other than newline and tab as
//! the six characters `\u00XX`, so nothing in a store can move the cursor,
//! retitle the window or forge a line. JSON output stays valid: serde_json
//! already escapes C0 characters in strings, and the remaining controls (DEL,
//! C1) only occur inside strings, where `\u00XX` means the same character.

use std::io::{self, Write};

/// UTF-8 of the C1 controls (U+0080–U+009F) is `0xC2 0x80..=0x9F`.
const C1_LEAD: u8 = 0xC2;

pub struct SafeWriter<W: Write> {
    inner: W,
    /// A `0xC2` that ended the previous write: its meaning depends on the
    /// next byte.
    held_lead: bool,
}

impl<W: Write> SafeWriter<W> {
    pub fn new(inner: W) -> Self {
        SafeWriter { inner, held_lead: false }
    }

    fn escape(&mut self, c: u32) -> io::Result<()> {
        write!(self.inner, "\\u{c:04x}")
    }
}

fn is_c0_or_del(b: u8) -> bool {
    (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f
}

impl<W: Write> Write for SafeWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut plain = 0; // start of the bytes not yet written through
        let mut i = 0;
        if self.held_lead {
            self.held_lead = false;
            match buf.first() {
                Some(&b) if (0x80..=0x9f).contains(&b) => {
                    self.escape(u32::from(b))?;
                    i = 1;
                    plain = 1;
                }
                Some(_) => self.inner.write_all(&[C1_LEAD])?,
                None => {
                    self.held_lead = true;
                    return Ok(0);
                }
            }
        }
        while i < buf.len() {
            let b = buf[i];
            if is_c0_or_del(b) {
                self.inner.write_all(&buf[plain..i])?;
                self.escape(u32::from(b))?;
                i += 1;
                plain = i;
            } else if b == C1_LEAD {
                match buf.get(i + 1) {
                    Some(&n) if (0x80..=0x9f).contains(&n) => {
                        self.inner.write_all(&buf[plain..i])?;
                        self.escape(u32::from(n))?;
                        i += 2;
                        plain = i;
                    }
                    Some(_) => i += 1,
                    None => {
                        self.inner.write_all(&buf[plain..i])?;
                        self.held_lead = true;
                        return Ok(buf.len());
                    }
                }
            } else {
                i += 1;
            }
        }
        self.inner.write_all(&buf[plain..])?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if std::mem::take(&mut self.held_lead) {
            self.inner.write_all(&[C1_LEAD])?;
        }
        self.inner.flush()
    }
}

/// `text` as [`SafeWriter`] would print it (for lines written to stderr).
pub fn safe(text: &str) -> String {
    let mut w = SafeWriter::new(Vec::with_capacity(text.len()));
    let _ = w.write_all(text.as_bytes()).and_then(|()| w.flush());
    String::from_utf8_lossy(&w.inner).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(chunks: &[&[u8]]) -> String {
        let mut w = SafeWriter::new(Vec::new());
        for c in chunks {
            w.write_all(c).unwrap();
        }
        w.flush().unwrap();
        String::from_utf8(w.inner).unwrap()
    }

    #[test]
    fn audit_output_escapes_every_control_character_but_newline_and_tab() {
        let text = "a\u{1b}[2J\u{1b}]0;owned\u{7}\r\n\tb\u{7f}c\u{9b}31m\u{85}é€";
        assert_eq!(safe(text), "a\\u001b[2J\\u001b]0;owned\\u0007\\u000d\n\tb\\u007fc\\u009b31m\\u0085é€");
    }

    #[test]
    fn a_c1_control_split_across_writes_is_still_escaped() {
        let bytes = "x\u{9b}y".as_bytes();
        assert_eq!(through(&[&bytes[..2], &bytes[2..]]), "x\\u009by");
        assert_eq!(through(&[&bytes[..2], b"", &bytes[2..]]), "x\\u009by");
        let e_acute = "é".as_bytes(); // 0xC3 0xA9: not a C1 lead
        assert_eq!(through(&[&e_acute[..1], &e_acute[1..]]), "é");
        let nbsp = "\u{a0}".as_bytes(); // 0xC2 0xA0: a C1 lead, not a control
        assert_eq!(through(&[&nbsp[..1], &nbsp[1..]]), "\u{a0}");
    }

    #[test]
    fn json_output_stays_valid_json_with_the_same_strings() {
        let v = serde_json::json!({"message": "peer \u{1b}[31m said \u{9b}\u{7f} hi"});
        let out = safe(&serde_json::to_string_pretty(&v).unwrap());
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap(), v);
    }
}
