//! The limiter's Lua on a server: a Functions library run with FCALL, or,
//! where the server cannot run Functions, the assembled scripts run with
//! EVALSHA; loaded at start, and loaded again when the server lost them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use redis::{Script, Value};

use crate::limiter::script::{FunctionLibrary, BLOCK_LUA, LIMITER_LUA};
use crate::limiter::shape::{Shape, ShapeLibrary};

use super::connection::Connection;
use super::RedisError;

/// How the limiter runs on Redis: what [`RedisStore::scripts`] reports.
///
/// [`RedisStore::scripts`]: super::RedisStore::scripts
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scripts {
    /// A Functions library, `FCALL` (Redis 7+).
    Functions,
    /// EVALSHA of the assembled scripts.
    Eval,
}

/// Which of the two entry points a call runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum Entry {
    /// `lua/limiter.lua` (and `lua/jobs.lua` behind it).
    Limiter,
    /// `lua/block.lua`.
    Block,
}

/// Both entry points as a library and as scripts, and which of the two
/// this server runs. One per store, shared by its clones.
pub(super) struct Runner {
    limiter: Script,
    block: Script,
    library: FunctionLibrary,
    /// Cleared for good when the server has no Functions (Redis < 7) or the
    /// ACL user may not load them: the EVALSHA scripts take over.
    functions_on: AtomicBool,
    /// The shapes' libraries this store has loaded (`limiter::shape`),
    /// each generated and loaded the first time a call of its shape runs.
    shapes: Mutex<HashMap<Shape, Arc<ShapeLibrary>>>,
    /// Off with `THROTTLE_LIMITER_SHAPES=off` in the environment: every call
    /// runs the general function (an escape hatch, and the baseline the
    /// end-to-end benchmark measures the shapes against).
    shapes_on: bool,
}

/// The environment variable that turns the generated shapes off.
pub const SHAPES_ENV: &str = "THROTTLE_LIMITER_SHAPES";

/// The most shape libraries one store loads; calls of further shapes run
/// the general function. Each library carries the helpers and algorithms
/// (about 130 KB of Redis' Functions memory, measured with `INFO memory`),
/// so this bounds what one version of the worker adds to Redis at about
/// 2 MB; a fleet's config has a handful of shapes.
const MAX_SHAPES: usize = 16;

impl Runner {
    /// Both scripts hashed once, Functions first.
    pub(super) fn new() -> Runner {
        Runner {
            limiter: Script::new(LIMITER_LUA),
            block: Script::new(BLOCK_LUA),
            library: FunctionLibrary::new(),
            functions_on: AtomicBool::new(true),
            shapes: Mutex::new(HashMap::new()),
            shapes_on: std::env::var(SHAPES_ENV).map_or(true, |v| v != "off"),
        }
    }

    /// Loads the Functions library (every primary of a cluster), or, where
    /// the server cannot run Functions, both scripts into its script cache.
    pub(super) async fn load(&self, conn: &Connection) -> Result<(), RedisError> {
        if self.mode() == Scripts::Functions {
            match self.load_functions(conn).await {
                Ok(()) => return Ok(()),
                Err(e) if no_functions(&e) => {
                    self.functions_on.store(false, Ordering::Release);
                    tracing::info!(
                        reason = %e,
                        "Redis cannot load Functions here; running the limiter as EVALSHA scripts"
                    );
                }
                Err(e) => return Err(RedisError::Load(e)),
            }
        }
        self.load_scripts(conn).await
    }

    /// `FUNCTION LOAD REPLACE` of the library (the same name always holds
    /// the same code, so replacing is idempotent).
    async fn load_functions(&self, conn: &Connection) -> redis::RedisResult<()> {
        load_library(conn, &self.library.code).await
    }

    /// The library of `shape`, generated and loaded on first use; `None`
    /// when calls of this shape run the general function (Functions off,
    /// or [`MAX_SHAPES`] loaded already).
    async fn shape_library(
        &self,
        conn: &Connection,
        shape: &Shape,
    ) -> redis::RedisResult<Option<Arc<ShapeLibrary>>> {
        if !self.shapes_on || self.mode() != Scripts::Functions {
            return Ok(None);
        }
        let known = {
            let shapes = self.shapes.lock().expect("shapes lock");
            match shapes.get(shape) {
                Some(lib) => return Ok(Some(lib.clone())),
                None => shapes.len() >= MAX_SHAPES,
            }
        };
        if known {
            return Ok(None);
        }
        let lib = Arc::new(ShapeLibrary::new(shape));
        load_library(conn, &lib.code).await?;
        tracing::debug!(shape = %shape.name(), library = %lib.name, "loaded the limiter's function for a call shape");
        self.shapes
            .lock()
            .expect("shapes lock")
            .insert(shape.clone(), lib.clone());
        Ok(Some(lib))
    }

    /// Loads `shape`'s library now (nothing when loaded already, Functions
    /// are off, or the store holds its most shapes); an ACL user who may
    /// not load Functions is no error: the general function runs.
    pub(super) async fn prepare_shape(
        &self,
        conn: &Connection,
        shape: &Shape,
    ) -> redis::RedisResult<()> {
        match self.shape_library(conn, shape).await {
            Err(e) if no_functions(&e) => Ok(()),
            done => done.map(|_| ()),
        }
    }

    /// FCALL of `shape`'s generated function (its library loaded first, and
    /// again when the server lost it); `None` when this call must run the
    /// general function instead (see [`Runner::shape_library`]).
    pub(super) async fn call_shape(
        &self,
        conn: &Connection,
        shape: &Shape,
        keys: &[&str],
        args: &[String],
    ) -> Option<redis::RedisResult<Vec<i64>>> {
        let lib = match self.shape_library(conn, shape).await {
            Ok(Some(lib)) => lib,
            Ok(None) => return None,
            // An ACL user who may not load Functions: the general function
            // (and its own fallback to scripts) handles the call.
            Err(e) if no_functions(&e) => return None,
            Err(e) => return Some(Err(e)),
        };
        let mut handle = conn.get();
        let mut fcall = redis::cmd("FCALL");
        fcall.arg(&lib.function).arg(keys.len()).arg(keys).arg(args);
        Some(match fcall.query_async(&mut handle).await {
            Err(e) if function_missing(&e) => {
                tracing::info!(shape = %shape.name(), "Redis lost a call shape's Functions library; loading it again");
                match load_library(conn, &lib.code).await {
                    Ok(()) => fcall.query_async(&mut handle).await,
                    Err(e) => Err(e),
                }
            }
            done => done,
        })
    }

    /// Runs the limiter as EVALSHA scripts from now on.
    pub(super) async fn use_eval(&self, conn: &Connection) -> Result<(), RedisError> {
        self.functions_on.store(false, Ordering::Release);
        self.load_scripts(conn).await
    }

    /// How the limiter runs on this server.
    pub(super) fn mode(&self) -> Scripts {
        if self.functions_on.load(Ordering::Acquire) {
            Scripts::Functions
        } else {
            Scripts::Eval
        }
    }

    /// The library loaded with Functions (its name and FCALL names).
    pub(super) fn library(&self) -> &FunctionLibrary {
        &self.library
    }

    async fn load_scripts(&self, conn: &Connection) -> Result<(), RedisError> {
        let mut conn = conn.get();
        self.limiter
            .load_async(&mut conn)
            .await
            .map_err(RedisError::Load)?;
        self.block
            .load_async(&mut conn)
            .await
            .map_err(RedisError::Load)?;
        Ok(())
    }

    /// SHA1 of the limiter script.
    pub(super) fn limiter_sha(&self) -> &str {
        self.limiter.get_hash()
    }

    /// FCALL the entry's function, or EVALSHA its script where Functions
    /// are off. A server that lost the library gets it again and the call
    /// is retried once; one that turns out to have no Functions (a
    /// failover to an older server) switches the store to scripts.
    pub(super) async fn call<T: redis::FromRedisValue, A: redis::ToRedisArgs>(
        &self,
        conn: &Connection,
        entry: Entry,
        keys: &[&str],
        args: &[A],
    ) -> redis::RedisResult<T> {
        let (function, script) = match entry {
            Entry::Limiter => (&self.library.limiter, &self.limiter),
            Entry::Block => (&self.library.block, &self.block),
        };
        let mut handle = conn.get();
        if self.mode() == Scripts::Functions {
            let mut fcall = redis::cmd("FCALL");
            fcall.arg(function).arg(keys.len()).arg(keys).arg(args);
            match fcall.query_async(&mut handle).await {
                Err(e) if function_missing(&e) => {
                    tracing::info!("Redis lost the limiter's Functions library; loading it again");
                    self.load_functions(conn).await?;
                    return fcall.query_async(&mut handle).await;
                }
                Err(e) if no_functions(&e) => {
                    tracing::warn!(reason = %e, "Redis cannot run Functions; switching to EVALSHA scripts");
                    self.functions_on.store(false, Ordering::Release);
                }
                done => return done,
            }
        }
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(a);
        }
        inv.invoke_async(&mut handle).await
    }
}

/// `FUNCTION LOAD REPLACE` of a library (every primary of a cluster).
async fn load_library(conn: &Connection, code: &str) -> redis::RedisResult<()> {
    let mut conn = conn.get();
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(code)
        .query_async::<Value>(&mut conn)
        .await
        .map(|_| ())
}

/// The server has no such function: it lost the library (restart without
/// persistence, FUNCTION FLUSH, a new cluster master).
fn function_missing(e: &redis::RedisError) -> bool {
    e.detail().is_some_and(|d| d.contains("Function not found"))
}

/// The server cannot run Functions at all: older than Redis 7, or an ACL
/// user without FUNCTION LOAD or FCALL.
fn no_functions(e: &redis::RedisError) -> bool {
    // A key outside the user's patterns is NOPERM too, but names no command.
    let text = e.to_string().to_lowercase();
    text.contains("unknown command") || (text.contains("noperm") && text.contains("command"))
}
