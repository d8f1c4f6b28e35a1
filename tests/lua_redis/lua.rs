//! The Lua side of the embedded Redis: a Lua 5.1 state set up as Redis
//! sets up its scripting engine (the libraries the scripts use: base,
//! table, string, math, and Redis' `struct`; the `redis` table; globals
//! protected), and the conversions between Lua values and Redis replies
//! that Redis makes at `redis.call` and at a script's return.

use std::collections::HashMap;

use mlua::{Function, Lua, LuaOptions, MultiValue, StdLib, Table, Value, Variadic};

use super::commands::{self, format_double, Reply};
use super::keyspace::Keyspace;

/// What `redis.call` reaches: the keyspace, and the server's clock while
/// a script runs (frozen, as Redis freezes it for key expiry: one script
/// is one instant).
pub struct Server {
    pub keys: Keyspace,
    pub now_us: u64,
}

/// A Lua state with Redis' scripting environment and an empty keyspace.
pub fn new_state() -> mlua::Result<Lua> {
    let lua = Lua::new_with(
        StdLib::TABLE | StdLib::STRING | StdLib::MATH,
        LuaOptions::default(),
    )?;
    lua.set_app_data(Server {
        keys: Keyspace::default(),
        now_us: 0,
    });
    let globals = lua.globals();
    globals.set("redis", redis_table(&lua)?)?;
    globals.set("struct", struct_table(&lua)?)?;
    protect_globals(&lua)?;
    Ok(lua)
}

/// Loads a Functions library as `FUNCTION LOAD` does: the `#!lua` line
/// off, the body run once with `redis.register_function` (and without
/// `redis.call`, which Redis refuses at a load); the functions it
/// registered, by name.
pub fn load_library(lua: &Lua, code: &str) -> mlua::Result<HashMap<String, Function>> {
    let body = match code.strip_prefix("#!") {
        Some(rest) => rest.split_once('\n').map_or("", |(_, body)| body),
        None => code,
    };
    let redis: Table = lua.globals().raw_get("redis")?;
    let registered = lua.create_table()?;
    let into = registered.clone();
    redis.raw_set(
        "register_function",
        lua.create_function(move |_, (name, f): (String, Function)| into.raw_set(name, f))?,
    )?;
    let call: Value = redis.raw_get("call")?;
    redis.raw_set(
        "call",
        lua.create_function(|_, _: MultiValue| -> mlua::Result<()> {
            Err(mlua::Error::runtime(
                "redis.call is not allowed while a library loads",
            ))
        })?,
    )?;
    let loaded = lua.load(body).set_name("@library").exec();
    redis.raw_set("call", call)?;
    redis.raw_set("register_function", Value::Nil)?;
    loaded?;
    registered.pairs::<String, Function>().collect()
}

/// `redis.call`, `redis.pcall`, `redis.error_reply`, `redis.status_reply`:
/// what `lua/` uses (`redis.log`, `redis.sha1hex`, `redis.setresp` and
/// `redis.replicate_commands` are not, so a script that starts to fails).
fn redis_table(lua: &Lua) -> mlua::Result<Table> {
    let redis = lua.create_table()?;
    redis.set(
        "call",
        lua.create_function(|lua, args: MultiValue| call(lua, args, true))?,
    )?;
    redis.set(
        "pcall",
        lua.create_function(|lua, args: MultiValue| call(lua, args, false))?,
    )?;
    redis.set(
        "error_reply",
        lua.create_function(|lua, msg: mlua::String| {
            let t = lua.create_table()?;
            t.raw_set("err", msg)?;
            Ok(t)
        })?,
    )?;
    redis.set(
        "status_reply",
        lua.create_function(|lua, msg: mlua::String| {
            let t = lua.create_table()?;
            t.raw_set("ok", msg)?;
            Ok(t)
        })?,
    )?;
    Ok(redis)
}

/// One `redis.call` (`raise`) or `redis.pcall`: the arguments as Redis
/// converts them, the command run on the keyspace, its reply as Lua sees
/// it. A failed command raises (call) or returns `{err = ...}` (pcall).
fn call(lua: &Lua, args: MultiValue, raise: bool) -> mlua::Result<Value> {
    if args.is_empty() {
        return Err(mlua::Error::runtime(
            "Please specify at least one argument for this redis lib call",
        ));
    }
    let mut argv = Vec::with_capacity(args.len());
    for v in args {
        argv.push(match v {
            Value::String(s) => s.as_bytes().to_vec(),
            // Not Lua's own %.14g, which loses digits: Redis writes %.17g.
            Value::Number(n) => format_double(n).into_bytes(),
            Value::Integer(i) => i.to_string().into_bytes(),
            _ => {
                return Err(mlua::Error::runtime(
                    "Lua redis lib command arguments must be strings or integers",
                ))
            }
        });
    }
    let outcome = {
        let mut server = lua
            .app_data_mut::<Server>()
            .expect("the state is made with its server");
        let now = server.now_us;
        commands::run(&mut server.keys, now, &argv)
    };
    match outcome {
        Ok(reply) => to_lua(lua, &reply),
        Err(e) if raise => Err(mlua::Error::runtime(e.to_string())),
        Err(e) => to_lua(lua, &Reply::Error(e.to_string())),
    }
}

/// A reply as Redis hands it to Lua: nil as false, integers as numbers,
/// status and error replies as `{ok = ...}` and `{err = ...}` tables.
fn to_lua(lua: &Lua, reply: &Reply) -> mlua::Result<Value> {
    Ok(match reply {
        Reply::Nil => Value::Boolean(false),
        Reply::Int(i) => Value::Number(*i as f64),
        Reply::Bulk(b) => Value::String(lua.create_string(b)?),
        Reply::Status(s) | Reply::Error(s) => {
            let t = lua.create_table()?;
            let field = if matches!(reply, Reply::Status(_)) {
                "ok"
            } else {
                "err"
            };
            t.raw_set(field, s.as_str())?;
            Value::Table(t)
        }
        Reply::Array(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
    })
}

/// A script's return value as Redis replies it: a number truncated to an
/// integer, true as 1, false and nil as nil, a table with `err` an error,
/// with `ok` a status, else an array up to its first nil.
pub fn from_lua(v: &Value) -> mlua::Result<Reply> {
    Ok(match v {
        Value::Nil | Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        // C's (long long) cast: toward zero.
        Value::Number(n) => Reply::Int(n.trunc() as i64),
        Value::Integer(i) => Reply::Int(*i),
        Value::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        Value::Table(t) => {
            if let Value::String(e) = t.raw_get::<Value>("err")? {
                return Ok(Reply::Error(e.to_string_lossy()));
            }
            if let Value::String(ok) = t.raw_get::<Value>("ok")? {
                return Ok(Reply::Status(ok.to_string_lossy()));
            }
            let mut items = Vec::new();
            for j in 1.. {
                match t.raw_get::<Value>(j)? {
                    Value::Nil => break,
                    item => items.push(from_lua(&item)?),
                }
            }
            Reply::Array(items)
        }
        _ => Reply::Nil,
    })
}

/// Redis' protection of the globals: reading one that does not exist, or
/// making one, is an error (KEYS and ARGV are set with `rawset`).
fn protect_globals(lua: &Lua) -> mlua::Result<()> {
    let mt = lua.create_table()?;
    mt.set(
        "__index",
        lua.create_function(|_, (_, name): (Table, Value)| -> mlua::Result<Value> {
            Err(mlua::Error::runtime(format!(
                "Script attempted to access nonexistent global variable '{}'",
                describe(&name)
            )))
        })?,
    )?;
    mt.set(
        "__newindex",
        lua.create_function(
            |_, (_, name, _): (Table, Value, Value)| -> mlua::Result<()> {
                Err(mlua::Error::runtime(format!(
                    "Script attempted to create global variable '{}'",
                    describe(&name)
                )))
            },
        )?,
    )?;
    lua.globals().set_metatable(Some(mt))?;
    Ok(())
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => s.to_string_lossy(),
        other => format!("{other:?}"),
    }
}

/// Redis' bundled `struct` library, for the formats `lua/` uses: byte
/// order (`>`, `<`, `=`) and doubles (`d`). Any other format is an error.
fn struct_table(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set(
        "pack",
        lua.create_function(|lua, (fmt, args): (mlua::String, Variadic<f64>)| {
            let mut out = Vec::new();
            let mut args = args.into_iter();
            for item in format_items(&fmt.as_bytes())? {
                let x = args.next().ok_or_else(|| {
                    mlua::Error::runtime("bad argument to 'pack' (number expected, got no value)")
                })?;
                out.extend(if item.big {
                    x.to_be_bytes()
                } else {
                    x.to_le_bytes()
                });
            }
            lua.create_string(&out)
        })?,
    )?;
    t.set(
        "unpack",
        lua.create_function(
            |_, (fmt, data, pos): (mlua::String, mlua::String, Option<i64>)| {
                let data = data.as_bytes();
                // 1-based, as Lua's strings are.
                let mut at = usize::try_from(pos.unwrap_or(1) - 1).map_err(|_| {
                    mlua::Error::runtime(
                        "bad argument #3 to 'unpack' (offset must be 1 or greater)",
                    )
                })?;
                let mut values = Vec::new();
                for item in format_items(&fmt.as_bytes())? {
                    let bytes: [u8; 8] = data
                        .get(at..at + 8)
                        .and_then(|b| b.try_into().ok())
                        .ok_or_else(|| {
                            mlua::Error::runtime(
                                "bad argument #2 to 'unpack' (data string too short)",
                            )
                        })?;
                    values.push(Value::Number(if item.big {
                        f64::from_be_bytes(bytes)
                    } else {
                        f64::from_le_bytes(bytes)
                    }));
                    at += 8;
                }
                values.push(Value::Number((at + 1) as f64));
                Ok(MultiValue::from_vec(values))
            },
        )?,
    )?;
    Ok(t)
}

/// One `d` of a struct format, with the byte order in force there.
struct Item {
    big: bool,
}

fn format_items(fmt: &[u8]) -> mlua::Result<Vec<Item>> {
    let mut big = cfg!(target_endian = "big");
    let mut items = Vec::new();
    for &c in fmt {
        match c {
            b'>' => big = true,
            b'<' => big = false,
            b'=' => big = cfg!(target_endian = "big"),
            b' ' => {}
            b'd' => items.push(Item { big }),
            other => {
                return Err(mlua::Error::runtime(format!(
                    "struct format option '{}' is not implemented by the embedded Redis",
                    other as char
                )))
            }
        }
    }
    Ok(items)
}
