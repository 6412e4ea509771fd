//! A drop-in `libibverbs.so.1` over the vrdma guest library.
//!
//! Applications linked against rdma-core's libibverbs run unmodified over vrdma when this
//! library (installed as `libibverbs.so.1`) comes first in `LD_LIBRARY_PATH`. Struct layouts
//! are rdma-core's ([`sys`], generated from its headers); exported names carry rdma-core's
//! symbol versions (`libibverbs.map`, see `build.rs` and `src/export.rs`). The context's
//! `ibv_context_ops` table holds the data path that the static inline functions of
//! `<infiniband/verbs.h>` call (`src/datapath.rs`). See README.md for what is provided.

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
pub mod sys;

mod ah_wc;
mod async_events;
mod async_verbs;
mod cm_events;
mod config;
mod context;
mod cq;
mod cq_ex;
mod datapath;
mod device;
mod eth_l2;
mod events;
mod export;
mod fd;
mod ffi;
mod fork;
mod gid_table;
mod maps;
mod marshall;
mod memory;
mod mr_rereg;
mod objects;
mod provider_abi;
mod qp;
mod qp_ex;
mod query;
mod query_ex;
mod rdmacm;
mod rsocket;
mod srq;
mod strings;
mod transport;
mod unsupported;
mod windows;
