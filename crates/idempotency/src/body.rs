//! A body the route's type refused, JSON or a form, told as a client can act on it: a sentence
//! without the parser's line and column, and the JSON pointer (RFC 6901) of the field at fault (a
//! form's `items[0][sku]` is `/items/0/sku`, as in its JSON twin).

use serde::de::DeserializeOwned;

/// Why a body is not the JSON a route takes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.detail())]
pub struct BodyError {
    /// The parser's message, without its position.
    message: String,
    /// Whether the body is not JSON (or form data) at all, rather than of another shape.
    syntax: bool,
    /// Whether the body came as a form (`application/x-www-form-urlencoded`).
    form: bool,
    /// The pointer of the field at fault, when one is.
    pointer: Option<String>,
}

impl BodyError {
    /// The error of a typed parse of `bytes` as `T`. The body is parsed again only now, tracking
    /// the path, so that a body that parses pays nothing for it.
    pub fn of<T: DeserializeOwned>(bytes: &[u8], error: &serde_json::Error) -> Self {
        let message = without_position(error);
        if error.is_syntax() || error.is_eof() || error.is_io() {
            return Self {
                message,
                syntax: true,
                form: false,
                pointer: None,
            };
        }
        let mut deserializer = serde_json::Deserializer::from_slice(bytes);
        let pointer = match serde_path_to_error::deserialize::<_, T>(&mut deserializer) {
            Err(tracked) => json_pointer(tracked.path(), &message),
            Ok(_) => String::new(),
        };
        Self {
            message,
            syntax: false,
            form: false,
            pointer: (!pointer.is_empty()).then_some(pointer),
        }
    }

    /// A form whose field names do not make one document (a field given twice, or both as a
    /// value and as an object, a list index skipped, brackets left open).
    pub(crate) fn form_syntax(message: String) -> Self {
        Self {
            message,
            syntax: true,
            form: true,
            pointer: None,
        }
    }

    /// A form whose field at `path` is not what the route's type takes.
    pub(crate) fn form_field(path: &serde_path_to_error::Path, error: &serde_json::Error) -> Self {
        let message = without_position(error);
        let pointer = json_pointer(path, &message);
        Self {
            message,
            syntax: false,
            form: true,
            pointer: (!pointer.is_empty()).then_some(pointer),
        }
    }

    /// The JSON pointer of the field at fault (`/amount`, `/lines/1/sku`), if one is.
    pub fn pointer(&self) -> Option<&str> {
        self.pointer.as_deref()
    }

    /// The refusal as a sentence.
    pub fn detail(&self) -> String {
        let message = &self.message;
        match (&self.pointer, self.syntax) {
            (_, true) if self.form => {
                format!("The request body is not valid form data: {message}.")
            }
            (_, true) => format!("The request body is not valid JSON: {message}."),
            (Some(pointer), false) => format!("The field `{pointer}` is invalid: {message}."),
            (None, false) => format!("The request body is invalid: {message}."),
        }
    }
}

/// serde's message without its ` at line 1 column 14`, which names no field a client knows.
fn without_position(error: &serde_json::Error) -> String {
    let message = error.to_string();
    match message.rfind(" at line ") {
        Some(at) if error.line() > 0 => message[..at].to_owned(),
        _ => message,
    }
}

/// The JSON pointer (RFC 6901) of the field a parse failed on. A missing member is reported by
/// serde at its parent, so its name, which the message quotes, is added.
fn json_pointer(path: &serde_path_to_error::Path, message: &str) -> String {
    use serde_path_to_error::Segment;
    let escape = |segment: &str| segment.replace('~', "~0").replace('/', "~1");
    let mut pointer = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => pointer.push_str(&format!("/{index}")),
            Segment::Map { key } => pointer.push_str(&format!("/{}", escape(key))),
            Segment::Enum { variant } => pointer.push_str(&format!("/{}", escape(variant))),
            Segment::Unknown => break,
        }
    }
    if let Some(name) = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
    {
        pointer.push('/');
        pointer.push_str(&escape(name));
    }
    pointer
}
