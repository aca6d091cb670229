/*
 * teraio/teraio.h — the whole public API.
 *
 * teraio is the storage layer of LLM training: lifetime-aware tensor
 * offloading to SSD and host memory (trace -> lifetime -> plan -> runtime,
 * over one I/O engine, with a simulator for planning at scale) and a
 * streaming, stateful data loader with its tokenizers.  Each module's
 * header is its manual.
 */
#ifndef TERAIO_TERAIO_H
#define TERAIO_TERAIO_H
#include "teraio/common.h"
#include "teraio/trace.h"
#include "teraio/lifetime.h"
#include "teraio/plan.h"
#include "teraio/engine.h"
#include "teraio/gpu.h"
#include "teraio/runtime.h"
#include "teraio/pager.h"
#include "teraio/sim.h"
#include "teraio/advise.h"
#include "teraio/tok.h"
#include "teraio/data.h"
#endif
