//! An embedded Redis for the limiter's scripts: the production Lua
//! (`LIMITER_LUA` and `BLOCK_LUA`, or the Functions library, exactly the
//! text the product sends) run as Redis' EVAL or FCALL runs it ([`Mode`]),
//! in a Lua 5.1 (mlua's vendored `lua51`, Redis' own Lua version), against
//! an in-memory keyspace whose keys expire on a clock the caller hands in. The simulation's Redis is this, on its virtual
//! clock; `tests/limiter/embedded.rs` holds it to a real Redis.
//!
//! - [`keyspace`]: strings, hashes and sorted sets with their expiry.
//! - [`commands`]: the commands `lua/` sends, with Redis' replies and
//!   errors; nothing else.
//! - `lua`: the Lua state as Redis sets it up (`redis.call`, `struct`,
//!   protected globals, a library's `redis.register_function`) and Redis'
//!   conversions of values and replies.
//! - `limiter`: the limiter's calls with the arguments the product builds
//!   and the replies read as the product reads them
//!   ([`EmbeddedRedis::run_jobs`] and its siblings).
//!
//! Not emulated: anything `lua/` does not use (other commands, RESP3,
//! script timeouts, `redis.log`); an attempt fails loudly. An error that
//! `redis.call` raises is a string here, a table in Redis 7: only a
//! script's own `pcall` could tell, and `lua/` has none.

pub mod commands;
pub mod keyspace;
mod limiter;
mod lua;

use mlua::{Function, Lua};
use throttle_worker::limiter::script::{FunctionLibrary, BLOCK_LUA, LIMITER_LUA};
use throttle_worker::limiter::MalformedReply;

pub use commands::{CommandError, Reply};

/// A key's value and expiry as copied ([`EmbeddedRedis::copy_keys`]);
/// `None`: no key.
pub type KeyCopy = Option<(keyspace::Value, Option<i64>)>;

/// Why an embedded call failed.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("the embedded Lua could not load the scripts: {0}")]
    Load(mlua::Error),
    /// The script raised an error or replied with one (`redis.error_reply`).
    #[error("script error: {0}")]
    Script(String),
    /// A reply of a shape the caller does not read (a string, a nested
    /// array, a negative count).
    #[error("script replied {0:?}, which the caller cannot read")]
    Shape(Reply),
    #[error(transparent)]
    Malformed(#[from] MalformedReply),
}

/// Which production script to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// The limiter: acquire, peek, refund, jobs, cancel, release.
    Limiter,
    /// A seller's downstream block.
    Block,
}

/// How the scripts run, as `RedisStore` runs them on a real server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `EVALSHA` of [`LIMITER_LUA`] and [`BLOCK_LUA`]: every call runs the
    /// whole script with new `KEYS` and `ARGV` globals, definitions
    /// included (a server without Functions).
    Eval,
    /// `FCALL` of the Functions library ([`FunctionLibrary::code`]),
    /// loaded once: its definitions run at the load, a call runs one
    /// registered function with keys and arguments as its parameters
    /// (Redis 7 and later; what the product prefers).
    Functions,
}

/// One Redis server with the limiter loaded.
pub struct EmbeddedRedis {
    lua: Lua,
    mode: Mode,
    /// The compiled script ([`Mode::Eval`]) or the registered function
    /// ([`Mode::Functions`]).
    limiter: Function,
    block: Function,
}

impl std::fmt::Debug for EmbeddedRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedRedis")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl EmbeddedRedis {
    /// An empty server with the limiter loaded to run as `mode` says.
    pub fn new(mode: Mode) -> Result<EmbeddedRedis, EmbeddedError> {
        let lua = lua::new_state().map_err(EmbeddedError::Load)?;
        let (limiter, block) = match mode {
            Mode::Eval => {
                let compile = |name: &str, text: &str| {
                    lua.load(text)
                        .set_name(format!("@{name}"))
                        .into_function()
                        .map_err(EmbeddedError::Load)
                };
                (
                    compile("LIMITER_LUA", LIMITER_LUA)?,
                    compile("BLOCK_LUA", BLOCK_LUA)?,
                )
            }
            Mode::Functions => {
                let library = FunctionLibrary::new();
                let mut registered =
                    lua::load_library(&lua, &library.code).map_err(EmbeddedError::Load)?;
                let mut take = |name: &str| {
                    registered.remove(name).ok_or_else(|| {
                        EmbeddedError::Load(mlua::Error::runtime(format!(
                            "the library registers no function {name}"
                        )))
                    })
                };
                (take(&library.limiter)?, take(&library.block)?)
            }
        };
        Ok(EmbeddedRedis {
            lua,
            mode,
            limiter,
            block,
        })
    }

    /// Runs `script` at `at_us` on the server's clock (its `TIME`, and the
    /// instant its keys expire against), as `EVALSHA script keys args` or
    /// `FCALL function keys args` by the server's [`Mode`]; an error reply
    /// or a raised error is [`EmbeddedError::Script`].
    pub fn invoke(
        &self,
        script: Script,
        keys: &[&str],
        args: &[String],
        at_us: u64,
    ) -> Result<Reply, EmbeddedError> {
        let f = match script {
            Script::Limiter => &self.limiter,
            Script::Block => &self.block,
        };
        self.call_function(f, self.mode, keys, args, at_us)
    }

    /// Runs `f` with `keys` and `args` as globals (EVAL) or parameters
    /// (FCALL).
    fn call_function(
        &self,
        f: &Function,
        mode: Mode,
        keys: &[&str],
        args: &[String],
        at_us: u64,
    ) -> Result<Reply, EmbeddedError> {
        self.server().now_us = at_us;
        let run = || -> mlua::Result<Reply> {
            let keys = self.lua.create_sequence_from(keys.iter().copied())?;
            let args = self
                .lua
                .create_sequence_from(args.iter().map(String::as_str))?;
            let out = match mode {
                Mode::Eval => {
                    let globals = self.lua.globals();
                    globals.raw_set("KEYS", keys)?;
                    globals.raw_set("ARGV", args)?;
                    f.call::<mlua::Value>(())?
                }
                Mode::Functions => f.call::<mlua::Value>((keys, args))?,
            };
            lua::from_lua(&out)
        };
        match run() {
            Ok(Reply::Error(e)) => Err(EmbeddedError::Script(e)),
            Ok(reply) => Ok(reply),
            Err(e) => Err(EmbeddedError::Script(e.to_string())),
        }
    }

    /// Runs Lua `source` as `EVAL source keys args` (tests of the
    /// emulation itself; the limiter's calls run the compiled scripts).
    pub fn eval_source(
        &self,
        source: &str,
        keys: &[&str],
        args: &[String],
        at_us: u64,
    ) -> Result<Reply, EmbeddedError> {
        let f = self
            .lua
            .load(source)
            .into_function()
            .map_err(EmbeddedError::Load)?;
        self.call_function(&f, Mode::Eval, keys, args, at_us)
    }

    /// One command from outside a script (a test's setup, the epoch of an
    /// install that ran before), at `at_us`.
    pub fn command(&self, argv: &[&str], at_us: u64) -> Result<Reply, CommandError> {
        let argv: Vec<Vec<u8>> = argv.iter().map(|a| a.as_bytes().to_vec()).collect();
        commands::run(&mut self.server().keys, at_us, &argv)
    }

    /// The server's run id, as `INFO server` names it.
    pub fn run_id(&self) -> String {
        self.server().keys.run_id()
    }

    /// `FLUSHALL`: every key gone, as after a restart without persistence
    /// (another run of the server).
    pub fn flushall(&self) {
        self.server().keys.flush();
    }

    /// Every key as it is now ([`keyspace::Keyspace::snapshot`]).
    pub fn snapshot(&self) -> keyspace::Snapshot {
        self.server().keys.snapshot()
    }

    /// A failover to a replica that holds `snapshot`, or a restart that
    /// loads it ([`keyspace::Keyspace::take_over`]): every key goes back
    /// to it, and the server's run id changes.
    pub fn take_over(&self, snapshot: keyspace::Snapshot) {
        self.server().keys.take_over(snapshot);
    }

    /// Copies of `keys` as they are now ([`keyspace::Keyspace::copy_of`]).
    pub fn copy_keys(&self, keys: &[String]) -> Vec<KeyCopy> {
        let server = self.server();
        keys.iter()
            .map(|k| server.keys.copy_of(k.as_bytes()))
            .collect()
    }

    /// Puts `copies` of `keys` back ([`EmbeddedRedis::copy_keys`]): those
    /// keys go back to that older copy, every other key stays.
    pub fn put_back(&self, keys: &[String], copies: Vec<KeyCopy>) {
        let mut server = self.server();
        for (k, copy) in keys.iter().zip(copies) {
            server.keys.put_back(k.as_bytes(), copy);
        }
    }

    /// Every key alive at `at_us`, sorted.
    pub fn keys(&self, at_us: u64) -> Vec<String> {
        let now_ms = i64::try_from(at_us / 1000).expect("a clock within i64 ms");
        self.server()
            .keys
            .keys(now_ms)
            .into_iter()
            .map(|k| String::from_utf8_lossy(&k).into_owned())
            .collect()
    }

    fn server(&self) -> mlua::AppDataRefMut<'_, lua::Server> {
        self.lua
            .app_data_mut::<lua::Server>()
            .expect("the state is made with its server")
    }
}
