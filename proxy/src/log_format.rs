//! kas's JSON log lines: span fields written as a JSON object in one pass.
//!
//! tracing-subscriber's `JsonFields` formats a span's fields when the span is created, by
//! collecting them into a `serde_json` map and serializing it through an `io::Write` adapter.
//! Every request on the rest listener has a span (request id, method, path): that was about a
//! tenth of kas's instructions per proxied request (callgrind), for text that is read only if
//! something logs inside the request. [`JsonSpanFields`] writes the same JSON object directly.
//! The JSON event formatter still reads it back as a map, so a log line is the same as before.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormattedFields;
use tracing_subscriber::fmt::format::{FormatFields, Writer};

/// Span fields as a JSON object (`{"request_id":"…","method":"GET"}`), for
/// `tracing_subscriber::fmt().json().fmt_fields(JsonSpanFields)`. Values are what `JsonFields`
/// makes of them: strings, `Display`ed and `Debug`ged values as strings, numbers and booleans
/// as such (a float that is not finite as `null`), bytes as an array of numbers.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonSpanFields;

/// Room for a typical span's fields (the rest span: a UUID, a method and a path).
const OBJECT_CAPACITY: usize = 256;

impl<'writer> FormatFields<'writer> for JsonSpanFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'writer>, fields: R) -> fmt::Result {
        // Built in one buffer, then written at once: the span's own string (empty when it is
        // created) is then allocated once instead of growing with every piece.
        let mut object = String::with_capacity(OBJECT_CAPACITY);
        object.push('{');
        let mut out = Writer::new(&mut object);
        let mut visitor = ObjectWriter { out: &mut out, first: true, result: Ok(()) };
        fields.record(&mut visitor);
        visitor.result?;
        object.push('}');
        writer.write_str(&object)
    }

    /// Fields recorded later (`Span::record`) are added to the object; a key recorded twice
    /// appears twice, and the last value is the one a reader's map keeps (as with `JsonFields`).
    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        if !current.fields.ends_with('}') {
            current.fields.clear();
            return self.format_fields(current.as_writer(), fields);
        }
        current.fields.pop();
        let first = current.fields == "{";
        let mut writer = current.as_writer();
        let mut object = ObjectWriter { out: &mut writer, first, result: Ok(()) };
        fields.record(&mut object);
        object.result?;
        current.fields.push('}');
        Ok(())
    }
}

struct ObjectWriter<'a, 'w> {
    out: &'a mut Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl ObjectWriter<'_, '_> {
    /// Writes `"name":` and then the value (after a comma unless first), skipping the fields
    /// `JsonFields` skips. `open` is written right after the colon: the pieces are written
    /// in as few calls as they can be (each goes through `dyn Write`).
    fn value(&mut self, field: &Field, open: &str, write: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        let start = if std::mem::replace(&mut self.first, false) { "\"" } else { ",\"" };
        self.result = self
            .out
            .write_str(start)
            .and_then(|()| JsonEscaped(self.out).write_str(name))
            .and_then(|()| self.out.write_str(open))
            .and_then(|()| write(self.out));
    }
}

/// What follows a field's name: the end of the name, the colon, and a string value's quote.
const BEFORE_STRING: &str = "\":\"";
const BEFORE_OTHER: &str = "\":";

impl Visit for ObjectWriter<'_, '_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.value(field, BEFORE_STRING, |out| {
            write!(JsonEscaped(out), "{value:?}")?;
            out.write_char('"')
        });
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.value(field, BEFORE_STRING, |out| {
            JsonEscaped(out).write_str(value)?;
            out.write_char('"')
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.value(field, BEFORE_OTHER, |out| write!(out, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.value(field, BEFORE_OTHER, |out| write!(out, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.value(field, BEFORE_OTHER, |out| write!(out, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.value(field, BEFORE_OTHER, |out| {
            if value.is_finite() { write!(out, "{value:?}") } else { out.write_str("null") }
        });
    }

    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        self.value(field, BEFORE_OTHER, |out| {
            out.write_char('[')?;
            for (i, b) in value.iter().enumerate() {
                if i > 0 {
                    out.write_char(',')?;
                }
                write!(out, "{b}")?;
            }
            out.write_char(']')
        });
    }
}

/// Writes what it is given as the inside of a JSON string.
struct JsonEscaped<'a, 'w>(&'a mut Writer<'w>);

impl fmt::Write for JsonEscaped<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // By byte: what needs escaping is ASCII, and the bytes of a multi-byte character never are.
        // Checked without stopping early, which the compiler turns into a few wide comparisons.
        let bytes = s.as_bytes();
        let needs_escape = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
        if !bytes.iter().fold(false, |any, &b| any | needs_escape(b)) {
            return self.0.write_str(s);
        }
        let mut plain = 0;
        for (i, &b) in bytes.iter().enumerate() {
            let escaped = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..0x20 => "",
                _ => continue,
            };
            self.0.write_str(&s[plain..i])?;
            if escaped.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(escaped)?;
            }
            plain = i + 1;
        }
        self.0.write_str(&s[plain..])
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Self;
        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    /// The same spans and event, logged once with tracing-subscriber's `JsonFields` and once with
    /// [`JsonSpanFields`]: the lines, parsed, are equal.
    fn log_line(ours: bool) -> serde_json::Value {
        let captured = Captured::default();
        let builder = tracing_subscriber::fmt().json().without_time().with_writer(captured.clone());
        let dispatch = if ours {
            tracing::Dispatch::new(builder.fmt_fields(JsonSpanFields).finish())
        } else {
            tracing::Dispatch::new(builder.finish())
        };
        tracing::dispatcher::with_default(&dispatch, || {
            let weird = "quote \" backslash \\ newline \n tab \t bell \u{7} é ✓";
            let outer = tracing::info_span!("outer", request_id = %"3f2a-…", method = ?"GET", count = 3u64);
            let _outer = outer.enter();
            let inner = tracing::info_span!(
                "inner",
                text = weird,
                shown = %weird,
                negative = -7i64,
                flag = true,
                ratio = 0.25f64,
                infinite = f64::INFINITY,
                r#type = "raw",
                later = tracing::field::Empty,
            );
            inner.record("later", "recorded");
            inner.record("flag", false);
            let _inner = inner.enter();
            tracing::info!(n = 1, "inside");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    #[test]
    fn span_fields_log_as_with_tracing_subscribers_json_fields() {
        let theirs = log_line(false);
        let ours = log_line(true);
        assert_eq!(ours, theirs);
        // What the comparison covers: both spans, every kind of value, fields recorded later.
        let inner = &ours["span"];
        assert_eq!(inner["text"], "quote \" backslash \\ newline \n tab \t bell \u{7} é ✓");
        assert_eq!(inner["shown"], inner["text"]);
        assert_eq!(inner["negative"], -7);
        assert_eq!(inner["flag"], false);
        assert_eq!(inner["ratio"], 0.25);
        assert_eq!(inner["infinite"], serde_json::Value::Null);
        assert_eq!(inner["type"], "raw");
        assert_eq!(inner["later"], "recorded");
        let outer = &ours["spans"][0];
        assert_eq!(outer["request_id"], "3f2a-…");
        assert_eq!(outer["method"], "\"GET\"");
        assert_eq!(outer["count"], 3);
    }
}
