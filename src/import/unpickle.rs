//! A pickle reader for plain data only: None, booleans, integers, floats, strings, bytes,
//! lists, tuples, dicts and sets, with the memo (objects shared between places, as PyTorch
//! shares frame dicts between the entries of a snapshot). Every opcode that would name a
//! global, build or call an object (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`,
//! `NEWOBJ`, persistent ids, extensions) is refused: nothing in the file is ever run.
//!
//! Why not serde-pickle's value decoder: it refuses an object shared by two containers when
//! that object holds a shared object itself ("recursive structure"), which every PyTorch
//! snapshot with frames does. Values come out as serde-pickle's [`Value`] tree (a shared
//! object is copied into each place).

use std::collections::{BTreeMap, BTreeSet};

use serde_pickle::{HashableValue, Value};

/// Containers are built in place (`EMPTY_LIST`, `BINPUT`, then `APPENDS`), so the stack and
/// the memo hold references into an arena.
#[derive(Clone, Debug)]
enum V {
    Leaf(Value),
    List(usize),
    Dict(usize),
    Set(usize),
    Tuple(Vec<V>),
    Mark,
}

enum Node {
    List(Vec<V>),
    Dict(Vec<(V, V)>),
    Set(Vec<V>),
}

/// Objects deeper than this are refused (a snapshot is a few levels deep; a cycle is endless).
const MAX_DEPTH: usize = 64;

/// Why a pickle was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PickleError {
    /// The opcodes do not make a value: truncated, unbalanced or of the wrong kind.
    #[error("{0}")]
    Malformed(&'static str),
    /// A text number that does not parse.
    #[error("a number that does not parse: {0}")]
    Number(String),
    /// An opcode that would import or build a Python object (never run here).
    #[error(
        "opcode {op:?} at byte {at} would name or build a Python object; a snapshot holds plain values only"
    )]
    RunsCode {
        /// The opcode.
        op: char,
        /// Its offset in the file.
        at: usize,
    },
    /// An opcode of no pickle protocol.
    #[error("unknown opcode {op:#04x} at byte {at}")]
    UnknownOpcode {
        /// The opcode.
        op: u8,
        /// Its offset in the file.
        at: usize,
    },
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or(PickleError::Malformed(
            "the pickle ends in the middle of an opcode",
        ))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }
    fn le(&mut self, n: usize) -> Result<u64, PickleError> {
        let mut v = 0u64;
        for (i, b) in self.take(n)?.iter().enumerate() {
            v |= u64::from(*b) << (8 * i);
        }
        Ok(v)
    }
    fn line(&mut self) -> Result<&str, PickleError> {
        let rest = &self.b[self.pos..];
        let n = rest
            .iter()
            .position(|&c| c == b'\n')
            .ok_or(PickleError::Malformed(
                "the pickle ends in the middle of a line",
            ))?;
        self.pos += n + 1;
        std::str::from_utf8(&rest[..n])
            .map_err(|_| PickleError::Malformed("a text opcode is not UTF-8"))
    }
    fn str(&mut self, n: usize) -> Result<Value, PickleError> {
        let s = self.take(n)?;
        Ok(Value::String(String::from_utf8_lossy(s).into_owned()))
    }
}

fn int_from_le(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::I64(0);
    }
    if bytes.len() > 16 {
        // Larger than any address or size: kept as a float, never used as one.
        return Value::F64(f64::INFINITY);
    }
    // Two's complement, little-endian, sign-extended to 128 bits.
    let neg = bytes[bytes.len() - 1] & 0x80 != 0;
    let mut buf = [if neg { 0xff } else { 0 }; 16];
    buf[..bytes.len()].copy_from_slice(bytes);
    let v = i128::from_le_bytes(buf);
    match i64::try_from(v) {
        Ok(i) => Value::I64(i),
        Err(_) => Value::F64(v as f64),
    }
}

/// Decodes `bytes` into a value tree, or says which opcode it refused.
pub fn loads(bytes: &[u8]) -> Result<Value, PickleError> {
    let mut r = Reader { b: bytes, pos: 0 };
    let mut stack: Vec<V> = Vec::new();
    let mut memo: BTreeMap<u64, V> = BTreeMap::new();
    let mut arena: Vec<Node> = Vec::new();
    let pop_mark = |stack: &mut Vec<V>| -> Result<Vec<V>, PickleError> {
        let at = stack
            .iter()
            .rposition(|v| matches!(v, V::Mark))
            .ok_or(PickleError::Malformed("no mark on the pickle stack"))?;
        let items = stack.split_off(at + 1);
        stack.pop();
        Ok(items)
    };
    loop {
        let op = r.u8()?;
        match op {
            0x80 => {
                r.u8()?; // PROTO
            }
            0x95 => {
                r.take(8)?; // FRAME
            }
            b'.' => break, // STOP
            b'(' => stack.push(V::Mark),
            b'N' => stack.push(V::Leaf(Value::None)),
            0x88 => stack.push(V::Leaf(Value::Bool(true))),
            0x89 => stack.push(V::Leaf(Value::Bool(false))),
            b'J' => stack.push(V::Leaf(Value::I64(r.le(4)? as u32 as i32 as i64))),
            b'K' => stack.push(V::Leaf(Value::I64(r.le(1)? as i64))),
            b'M' => stack.push(V::Leaf(Value::I64(r.le(2)? as i64))),
            0x8a => {
                let n = r.u8()? as usize;
                stack.push(V::Leaf(int_from_le(r.take(n)?)));
            }
            0x8b => {
                let n = r.le(4)? as usize;
                stack.push(V::Leaf(int_from_le(r.take(n)?)));
            }
            b'I' | b'L' => {
                let l = r.line()?.trim_end_matches('L');
                let v = match l {
                    "01" => Value::Bool(true),
                    "00" => Value::Bool(false),
                    _ => l
                        .parse::<i64>()
                        .map(Value::I64)
                        .unwrap_or(Value::F64(f64::INFINITY)),
                };
                stack.push(V::Leaf(v));
            }
            b'G' => stack.push(V::Leaf(Value::F64(f64::from_be_bytes(
                r.take(8)?.try_into().unwrap(),
            )))),
            b'F' => {
                let v = r
                    .line()?
                    .parse::<f64>()
                    .map_err(|e| PickleError::Number(e.to_string()))?;
                stack.push(V::Leaf(Value::F64(v)));
            }
            0x8c => {
                let n = r.u8()? as usize;
                stack.push(V::Leaf(r.str(n)?));
            }
            b'X' => {
                let n = r.le(4)? as usize;
                stack.push(V::Leaf(r.str(n)?));
            }
            0x8d => {
                let n = r.le(8)? as usize;
                stack.push(V::Leaf(r.str(n)?));
            }
            b'V' => {
                let s = r.line()?.to_string();
                stack.push(V::Leaf(Value::String(s)));
            }
            b'U' => {
                let n = r.u8()? as usize;
                stack.push(V::Leaf(r.str(n)?));
            }
            b'T' => {
                let n = r.le(4)? as usize;
                stack.push(V::Leaf(r.str(n)?));
            }
            b'C' => {
                let n = r.u8()? as usize;
                stack.push(V::Leaf(Value::Bytes(r.take(n)?.to_vec())));
            }
            b'B' => {
                let n = r.le(4)? as usize;
                stack.push(V::Leaf(Value::Bytes(r.take(n)?.to_vec())));
            }
            0x8e => {
                let n = r.le(8)? as usize;
                stack.push(V::Leaf(Value::Bytes(r.take(n)?.to_vec())));
            }
            b']' => {
                arena.push(Node::List(Vec::new()));
                stack.push(V::List(arena.len() - 1));
            }
            b'}' => {
                arena.push(Node::Dict(Vec::new()));
                stack.push(V::Dict(arena.len() - 1));
            }
            0x8f => {
                arena.push(Node::Set(Vec::new()));
                stack.push(V::Set(arena.len() - 1));
            }
            b')' => stack.push(V::Tuple(Vec::new())),
            b'l' => {
                let items = pop_mark(&mut stack)?;
                arena.push(Node::List(items));
                stack.push(V::List(arena.len() - 1));
            }
            b'd' => {
                let items = pop_mark(&mut stack)?;
                let pairs = pairs(items)?;
                arena.push(Node::Dict(pairs));
                stack.push(V::Dict(arena.len() - 1));
            }
            b't' => {
                let items = pop_mark(&mut stack)?;
                stack.push(V::Tuple(items));
            }
            0x91 => {
                let items = pop_mark(&mut stack)?;
                arena.push(Node::Set(items));
                stack.push(V::Set(arena.len() - 1));
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if stack.len() < n {
                    return Err(PickleError::Malformed("a tuple opcode on a short stack"));
                }
                let items = stack.split_off(stack.len() - n);
                stack.push(V::Tuple(items));
            }
            b'a' | b'e' | 0x90 => {
                let items = if op == b'a' {
                    vec![
                        stack
                            .pop()
                            .ok_or(PickleError::Malformed("append on an empty stack"))?,
                    ]
                } else {
                    pop_mark(&mut stack)?
                };
                match stack.last() {
                    Some(V::List(i)) | Some(V::Set(i)) => match &mut arena[*i] {
                        Node::List(l) | Node::Set(l) => l.extend(items),
                        Node::Dict(_) => unreachable!("lists and sets hold list nodes"),
                    },
                    _ => {
                        return Err(PickleError::Malformed(
                            "append to something that is not a list",
                        ));
                    }
                }
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let v = stack
                        .pop()
                        .ok_or(PickleError::Malformed("setitem on an empty stack"))?;
                    let k = stack
                        .pop()
                        .ok_or(PickleError::Malformed("setitem on a short stack"))?;
                    vec![k, v]
                } else {
                    pop_mark(&mut stack)?
                };
                match stack.last() {
                    Some(V::Dict(i)) => match &mut arena[*i] {
                        Node::Dict(d) => d.extend(pairs(items)?),
                        _ => unreachable!("dicts hold dict nodes"),
                    },
                    _ => {
                        return Err(PickleError::Malformed(
                            "setitem on something that is not a dict",
                        ));
                    }
                }
            }
            b'q' => {
                let id = r.le(1)?;
                memo.insert(
                    id,
                    stack
                        .last()
                        .cloned()
                        .ok_or(PickleError::Malformed("memo of nothing"))?,
                );
            }
            b'r' => {
                let id = r.le(4)?;
                memo.insert(
                    id,
                    stack
                        .last()
                        .cloned()
                        .ok_or(PickleError::Malformed("memo of nothing"))?,
                );
            }
            b'p' => {
                let id = r
                    .line()?
                    .parse::<u64>()
                    .map_err(|e| PickleError::Number(e.to_string()))?;
                memo.insert(
                    id,
                    stack
                        .last()
                        .cloned()
                        .ok_or(PickleError::Malformed("memo of nothing"))?,
                );
            }
            0x94 => {
                let id = memo.len() as u64;
                memo.insert(
                    id,
                    stack
                        .last()
                        .cloned()
                        .ok_or(PickleError::Malformed("memo of nothing"))?,
                );
            }
            b'h' | b'j' | b'g' => {
                let id = match op {
                    b'h' => r.le(1)?,
                    b'j' => r.le(4)?,
                    _ => r
                        .line()?
                        .parse::<u64>()
                        .map_err(|e| PickleError::Number(e.to_string()))?,
                };
                stack.push(
                    memo.get(&id)
                        .cloned()
                        .ok_or(PickleError::Malformed("a memo reference to nothing"))?,
                );
            }
            b'0' => {
                stack.pop();
            }
            b'1' => {
                pop_mark(&mut stack)?;
            }
            b'2' => stack.push(
                stack
                    .last()
                    .cloned()
                    .ok_or(PickleError::Malformed("dup of nothing"))?,
            ),
            b'c'
            | 0x93
            | b'R'
            | b'b'
            | b'i'
            | b'o'
            | 0x81
            | 0x92
            | b'P'
            | b'Q'
            | 0x82..=0x84
            | 0x96..=0x98 => {
                return Err(PickleError::RunsCode {
                    op: op as char,
                    at: r.pos - 1,
                });
            }
            other => {
                return Err(PickleError::UnknownOpcode {
                    op: other,
                    at: r.pos - 1,
                });
            }
        }
    }
    let top = stack
        .pop()
        .ok_or(PickleError::Malformed("the pickle holds nothing"))?;
    build(&top, &arena, 0)
}

fn pairs(items: Vec<V>) -> Result<Vec<(V, V)>, PickleError> {
    if !items.len().is_multiple_of(2) {
        return Err(PickleError::Malformed("a dict with a key and no value"));
    }
    let mut it = items.into_iter();
    let mut out = Vec::new();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Ok(out)
}

fn build(v: &V, arena: &[Node], depth: usize) -> Result<Value, PickleError> {
    if depth > MAX_DEPTH {
        return Err(PickleError::Malformed(
            "objects nested deeper than a snapshot's (or a cycle)",
        ));
    }
    let b = |x: &V| build(x, arena, depth + 1);
    Ok(match v {
        V::Leaf(l) => l.clone(),
        V::Mark => return Err(PickleError::Malformed("a mark left on the stack")),
        V::Tuple(items) => Value::Tuple(items.iter().map(b).collect::<Result<_, _>>()?),
        V::List(i) | V::Set(i) | V::Dict(i) => match &arena[*i] {
            Node::List(items) => Value::List(items.iter().map(b).collect::<Result<_, _>>()?),
            Node::Set(items) => Value::Set(
                items
                    .iter()
                    .map(|x| b(x).and_then(hashable))
                    .collect::<Result<BTreeSet<_>, _>>()?,
            ),
            Node::Dict(pairs) => {
                let mut d = BTreeMap::new();
                for (k, x) in pairs {
                    d.insert(hashable(b(k)?)?, b(x)?);
                }
                Value::Dict(d)
            }
        },
    })
}

fn hashable(v: Value) -> Result<HashableValue, PickleError> {
    v.into_hashable()
        .map_err(|_| PickleError::Malformed("a dict key or set item that cannot be one"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_containers_and_refused_globals() {
        // pickle.dumps({'x': [d], 'y': [d]}, protocol=2) with d = {'f': 's'}: d is shared.
        let shared = b"\x80\x02}q\x00(X\x01\x00\x00\x00xq\x01]q\x02}q\x03X\x01\x00\x00\x00fq\x04X\x01\x00\x00\x00sq\x05saX\x01\x00\x00\x00yq\x06]q\x07h\x03au.";
        let v = loads(shared).unwrap();
        let Value::Dict(d) = v else { panic!() };
        assert_eq!(d.len(), 2);
        assert_eq!(
            d[&HashableValue::String("x".into())],
            d[&HashableValue::String("y".into())]
        );
        // pickle.dumps(os.system) refers to a global: refused, never resolved.
        let global = b"\x80\x02cposix\nsystem\nq\x00.";
        let e = loads(global).unwrap_err();
        assert_eq!(e, PickleError::RunsCode { op: 'c', at: 2 });
        assert!(e.to_string().contains("plain values only"));
        assert_eq!(
            loads(b"\x80\x02]q\x00(K\x01").unwrap_err(),
            PickleError::Malformed("the pickle ends in the middle of an opcode"),
            "cut short"
        );
    }
}
