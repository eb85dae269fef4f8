//! Form-encoded bodies (`application/x-www-form-urlencoded`), as Stripe's SDKs and every `curl -d`
//! send them, with its bracket notation for nested objects and arrays:
//! `amount=1000&currency=eur&metadata[order_id]=6735&items[0][sku]=a&expand[]=x`.
//!
//! A form carries only text, so its values take the types the route's body type asks for while it
//! is parsed (`amount=1000` is the number 1000, `capture=true` the boolean), and the body is then
//! written as the JSON it is equivalent to. That JSON is what the mechanism fingerprints: a form
//! request and its JSON twin have the same fingerprint, so a retry may switch encodings and still
//! replay, and a mismatch names the same fields either way. A value the type reads as text (a
//! metadata value, an id) stays text: `metadata[order_id]=6735` is `"6735"`, as in the JSON.

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};
use serde_json::{Map, Number, Value};

use crate::body::BodyError;

/// The name serde_json gives the newtype a `RawValue` is read through.
const RAW_VALUE: &str = "$serde_json::private::RawValue";

/// How deep a form's brackets may nest, as JSON documents are bounded.
const MAX_DEPTH: usize = 32;

/// Whether a `Content-Type` names a form: `application/x-www-form-urlencoded`, with parameters
/// such as `charset`.
pub(super) fn is_form(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .eq_ignore_ascii_case("application/x-www-form-urlencoded")
}

/// The form in `bytes` parsed as `T`, and the JSON it is equivalent to (what is fingerprinted).
pub(super) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, Vec<u8>), BodyError> {
    let mut value = tree(bytes).map_err(BodyError::form_syntax)?;
    let parsed = serde_path_to_error::deserialize(Coerced(&mut value))
        .map_err(|error| BodyError::form_field(error.path(), error.inner()))?;
    let json =
        serde_json::to_vec(&value).map_err(|error| BodyError::form_syntax(error.to_string()))?;
    Ok((parsed, json))
}

/// One step of a field's name: `name`, then `[key]` or `[]`. An index (`items[0][sku]`) is a
/// key until the body's type asks for a list there ([`Coerced::list`]): `metadata[0]` is the
/// metadata key `"0"`, as Stripe reads it.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Key(String),
    Push,
}

/// The form as a tree of objects and arrays whose leaves are its text values.
fn tree(bytes: &[u8]) -> Result<Value, String> {
    let mut root = Value::Object(Map::new());
    for (name, value) in form_urlencoded::parse(bytes) {
        let steps = steps(&name)?;
        insert(&mut root, &name, &steps, value.into_owned())?;
    }
    Ok(root)
}

/// A field's name split into its steps: `metadata[order_id]` is `metadata`, `order_id`.
fn steps(name: &str) -> Result<Vec<Step>, String> {
    let malformed = || format!("the field name `{name}` is not `name`, `name[key]` or `name[]`");
    let (first, mut rest) = match name.find('[') {
        Some(at) => name.split_at(at),
        None => (name, ""),
    };
    if first.is_empty() {
        return Err(malformed());
    }
    let mut steps = vec![Step::Key(first.to_owned())];
    while !rest.is_empty() {
        let inner = rest.strip_prefix('[').ok_or_else(malformed)?;
        // A step ends at the `]` followed by the next `[` or by the end of the name, so that a
        // key may hold brackets of its own (`metadata[a]b]` is the key `a]b`), as a fuzzer's
        // keys do.
        let close = inner
            .match_indices(']')
            .map(|(at, _)| at)
            .find(|&at| inner[at + 1..].is_empty() || inner[at + 1..].starts_with('['))
            .ok_or_else(malformed)?;
        let (segment, after) = (&inner[..close], &inner[close + 1..]);
        steps.push(match segment {
            "" => Step::Push,
            key => Step::Key(key.to_owned()),
        });
        rest = after;
    }
    if steps.len() > MAX_DEPTH {
        return Err(format!(
            "the field name `{name}` nests deeper than {MAX_DEPTH}"
        ));
    }
    Ok(steps)
}

/// Puts `value` at `steps` under `node`, making the objects and arrays on the way.
fn insert(node: &mut Value, name: &str, steps: &[Step], value: String) -> Result<(), String> {
    let Some((step, rest)) = steps.split_first() else {
        return match node {
            Value::Null => {
                *node = Value::String(value);
                Ok(())
            }
            _ => Err(format!("the field `{name}` is given twice")),
        };
    };
    let conflict =
        || format!("the field `{name}` is given both as a value and as an object or list");
    let child = match step {
        Step::Key(key) => {
            if node.is_null() {
                *node = Value::Object(Map::new());
            }
            let Value::Object(members) = node else {
                return Err(conflict());
            };
            members.entry(key.clone()).or_insert(Value::Null)
        }
        Step::Push => {
            if node.is_null() {
                *node = Value::Array(Vec::new());
            }
            let Value::Array(items) = node else {
                return Err(conflict());
            };
            items.push(Value::Null);
            items.last_mut().ok_or_else(conflict)?
        }
    };
    insert(child, name, rest, value)
}

/// A deserializer over the form's tree that gives each text value the type asked for, and writes
/// that type back into the tree, so that the tree becomes the JSON the form is equivalent to.
struct Coerced<'a>(&'a mut Value);

impl Coerced<'_> {
    /// The text value, read as a JSON number and left in the tree as one.
    fn number(self) -> Result<Value, serde_json::Error> {
        if let Value::String(text) = &*self.0 {
            let number: Number = text
                .parse()
                .map_err(|_| de::Error::invalid_type(de::Unexpected::Str(text), &"a number"))?;
            *self.0 = Value::Number(number);
        }
        Ok(self.0.clone())
    }

    /// A list asked for where the form spelled an object by index (`items[0][sku]`, `items[1][sku]`):
    /// the object becomes the list, its indices counting up from 0.
    fn list(&mut self) -> Result<(), serde_json::Error> {
        let Value::Object(members) = &mut *self.0 else {
            return Ok(());
        };
        let mut indexed = Vec::with_capacity(members.len());
        for (key, value) in std::mem::take(members) {
            let index = key
                .parse::<usize>()
                .ok()
                .filter(|_| key.bytes().all(|byte| byte.is_ascii_digit()))
                .ok_or_else(|| {
                    de::Error::custom(format!("a list's items are named by index, not `{key}`"))
                })?;
            indexed.push((index, value));
        }
        indexed.sort_by_key(|(index, _)| *index);
        if indexed
            .iter()
            .enumerate()
            .any(|(at, (index, _))| at != *index)
        {
            return Err(de::Error::custom(
                "a list's indices count up from 0 without a gap",
            ));
        }
        *self.0 = Value::Array(indexed.into_iter().map(|(_, value)| value).collect());
        Ok(())
    }

    /// The text value `true` or `false`, left in the tree as a boolean.
    fn boolean(self) -> Result<Value, serde_json::Error> {
        if let Value::String(text) = &*self.0 {
            let flag = match text.as_str() {
                "true" => true,
                "false" => false,
                other => {
                    return Err(de::Error::invalid_type(
                        de::Unexpected::Str(other),
                        &"true or false",
                    ));
                }
            };
            *self.0 = Value::Bool(flag);
        }
        Ok(self.0.clone())
    }
}

macro_rules! numbers {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.number()?.$method(visitor)
        })*
    };
}

macro_rules! as_they_are {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.0.clone().$method(visitor)
        })*
    };
}

impl<'de> Deserializer<'de> for Coerced<'_> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Object(members) => visitor.visit_map(Members {
                members: members.iter_mut(),
                value: None,
            }),
            Value::Array(items) => visitor.visit_seq(Items(items.iter_mut())),
            other => other.clone().deserialize_any(visitor),
        }
    }

    numbers!(deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
             deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
             deserialize_f32 deserialize_f64);

    as_they_are!(deserialize_char deserialize_str deserialize_string deserialize_bytes
                 deserialize_byte_buf deserialize_unit deserialize_identifier);

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.boolean()?.deserialize_bool(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        // A form has no null: an optional field sent empty, or as the text `null` (how form
        // encoders write a null), is left out, as its JSON twin's `null` is.
        if matches!(&*self.0, Value::String(text) if text.is_empty() || text == "null") {
            *self.0 = Value::Null;
        }
        if self.0.is_null() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        // A type that reads its value's JSON text (`Box<RawValue>`, as an amount reads its
        // decimal text exactly) gets the text of the JSON twin's value: a number where the form's
        // text is one, else a string.
        if name == RAW_VALUE {
            if let Value::String(text) = &*self.0
                && let Ok(number) = text.parse::<Number>()
            {
                *self.0 = Value::Number(number);
            }
            return self.0.clone().deserialize_newtype_struct(name, visitor);
        }
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value, Self::Error> {
        self.list()?;
        match self.0 {
            Value::Array(items) => visitor.visit_seq(Items(items.iter_mut())),
            other => other.clone().deserialize_seq(visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Object(members) => visitor.visit_map(Members {
                members: members.iter_mut(),
                value: None,
            }),
            other => other.clone().deserialize_map(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_map(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.clone().deserialize_enum(name, variants, visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }
}

/// An object's members, each value coerced as its field's type asks.
struct Members<'a> {
    members: serde_json::map::IterMut<'a>,
    value: Option<&'a mut Value>,
}

impl<'de> MapAccess<'de> for Members<'_> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let Some((key, value)) = self.members.next() else {
            return Ok(None);
        };
        self.value = Some(value);
        seed.deserialize(key.as_str().into_deserializer()).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, Self::Error> {
        let value = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value asked for before its key"))?;
        seed.deserialize(Coerced(value))
    }
}

/// A list's items, each coerced as the list's type asks.
struct Items<'a>(std::slice::IterMut<'a, Value>);

impl<'de> SeqAccess<'de> for Items<'_> {
    type Error = serde_json::Error;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, Self::Error> {
        self.0
            .next()
            .map(|item| seed.deserialize(Coerced(item)))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Order {
        amount: i64,
        currency: String,
        #[serde(default)]
        capture: Option<bool>,
        #[serde(default)]
        metadata: BTreeMap<String, String>,
        #[serde(default)]
        items: Vec<Item>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Item {
        sku: String,
        quantity: u32,
    }

    fn json_of(form: &str) -> Value {
        let (_, json) = parse::<Order>(form.as_bytes()).unwrap();
        serde_json::from_slice(&json).unwrap()
    }

    #[test]
    fn a_form_is_the_json_its_fields_types_make_of_it() {
        let form = "amount=1000&currency=eur&capture=false&metadata[order_id]=6735\
                    &items[0][sku]=a%20b&items[0][quantity]=2&items[1][sku]=c&items[1][quantity]=1";
        assert_eq!(
            json_of(form),
            serde_json::json!({
                "amount": 1000, "currency": "eur", "capture": false,
                "metadata": { "order_id": "6735" },
                "items": [{ "sku": "a b", "quantity": 2 }, { "sku": "c", "quantity": 1 }]
            })
        );
        let (order, _) = parse::<Order>(form.as_bytes()).unwrap();
        assert_eq!(order.amount, 1000);
        assert_eq!(order.items[1].quantity, 1);
    }

    #[test]
    fn a_value_read_as_json_text_is_the_number_its_text_is() {
        #[derive(Deserialize)]
        struct Raw {
            amount: Box<serde_json::value::RawValue>,
            label: Box<serde_json::value::RawValue>,
        }
        let (raw, json) = parse::<Raw>(b"amount=4200&label=gift").unwrap();
        assert_eq!((raw.amount.get(), raw.label.get()), ("4200", r#""gift""#));
        assert_eq!(json, br#"{"amount":4200,"label":"gift"}"#);
    }

    #[test]
    fn an_optional_field_sent_empty_or_as_null_is_left_out() {
        for form in [
            "amount=1&currency=eur&capture=",
            "amount=1&currency=eur&capture=null",
        ] {
            let (order, json) = parse::<Order>(form.as_bytes()).unwrap();
            assert_eq!(order.capture, None, "{form}");
            assert_eq!(
                serde_json::from_slice::<Value>(&json).unwrap()["capture"],
                Value::Null
            );
        }
    }

    #[test]
    fn brackets_without_an_index_append() {
        #[derive(Deserialize)]
        struct Expand {
            expand: Vec<String>,
        }
        let (expand, json) = parse::<Expand>(b"expand[]=a&expand[]=b").unwrap();
        assert_eq!(expand.expand, ["a", "b"]);
        assert_eq!(json, br#"{"expand":["a","b"]}"#);
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_field() {
        let error = parse::<Order>(b"amount=ten&currency=eur").unwrap_err();
        assert_eq!(error.pointer(), Some("/amount"), "{error}");
        let error = parse::<Order>(b"amount=1&currency=eur&items[0][sku]=a&items[0][quantity]=x")
            .unwrap_err();
        assert_eq!(error.pointer(), Some("/items/0/quantity"), "{error}");
        let error = parse::<Order>(b"amount=1").unwrap_err();
        assert_eq!(error.pointer(), Some("/currency"), "{error}");
        let error = parse::<Order>(b"amount=1&currency=eur&colour=red").unwrap_err();
        assert!(error.detail().contains("colour"), "{error}");
    }

    #[test]
    fn an_index_is_a_key_unless_a_list_is_asked_for_there() {
        let json = json_of("amount=1&currency=eur&metadata[a]b]=c&metadata[x[y]=z");
        assert_eq!(
            json["metadata"],
            serde_json::json!({ "a]b": "c", "x[y": "z" })
        );
        let json = json_of("amount=1&currency=eur&metadata[0]=zero&metadata[channel]=web");
        assert_eq!(
            json["metadata"],
            serde_json::json!({ "0": "zero", "channel": "web" })
        );
        let json = json_of(
            "amount=1&currency=eur&items[1][sku]=b&items[1][quantity]=2\
                            &items[0][sku]=a&items[0][quantity]=1",
        );
        assert_eq!(json["items"][0]["sku"], "a", "in the order of the indices");
        for gap in [
            "items[1][sku]=a&items[1][quantity]=1",
            "items[x][sku]=a&items[x][quantity]=1",
        ] {
            let form = format!("amount=1&currency=eur&{gap}");
            let error = parse::<Order>(form.as_bytes()).unwrap_err();
            assert_eq!(error.pointer(), Some("/items"), "{form}: {error}");
        }
    }

    #[test]
    fn names_that_contradict_each_other_are_refused() {
        for form in [
            "amount=1&amount=2&currency=eur",
            "amount=1&currency=eur&metadata=x&metadata[a]=b",
            "amount=1&currency=eur&[x]=1",
            "amount=1&currency=eur&metadata[a=b",
        ] {
            let error = parse::<Order>(form.as_bytes()).unwrap_err();
            assert_eq!(error.pointer(), None, "{form}: {error}");
            assert!(
                error
                    .detail()
                    .starts_with("The request body is not valid form data"),
                "{error}"
            );
        }
    }

    #[test]
    fn only_the_form_media_type_is_a_form() {
        assert!(is_form("application/x-www-form-urlencoded"));
        assert!(is_form("Application/X-WWW-Form-Urlencoded; charset=utf-8"));
        assert!(!is_form("multipart/form-data"));
        assert!(!is_form("application/json"));
    }
}
