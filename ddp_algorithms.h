/* SPDX-License-Identifier: MIT (see LICENSE) */
/* ddp_algorithms.h — every collective algorithm family of libddp, in one include, private.
 *
 * The communicator (ddp_comm.h) picks one per call, by size, world size and settings (the same
 * on every rank), after its entry checks; the families never see it, only the point-to-point
 * engine (ddp_engine.h). Which collective runs what:
 *   all-reduce      the ring (ddp_ring.h), recursive doubling (ddp_recursive_doubling.h: small
 *                   messages), Rabenseifner (ddp_rabenseifner.h) or the hierarchical all-reduce
 *                   (ddp_hierarchical.h: many ranks on few hosts), as the cost model
 *                   (ddp_model.h) or DDP_ALGO picks.
 *   reduce-scatter, all-gather   the ring's halves (ddp_ring.h).
 *   broadcast       a pipelined chain around the ring (ddp_ring.h); up to 16 KiB inside the
 *                   call agreement (ddp_agree.h).
 *   reduce          up to 16 KiB inside the agreement; small: a binomial tree (ddp_tree.h);
 *                   large: a pipelined chain towards the root (ddp_chain.h).
 *   gather/scatter  small: a binomial tree (ddp_tree.h); large: linear (ddp_linear.h).
 *   all-to-all      pairwise exchange (ddp_pairwise.h).
 *   DDP_DETERMINISTIC  all-reduce, reduce-scatter and reduce add in rank order, from 3 ranks
 *                   on: every contribution to an element meets at its owner (ddp_deterministic.h).
 *   send/recv       direct: ddp_comm.h posts them (and groups) through the exchange helpers of
 *                   ddp_algorithm.h, which every family shares.
 * Small means: reduce up to _DDP_TREE_MAX_BYTES (16 KiB) when (1 + log2 p) buffers fit the
 * scratch; gather/scatter up to 16 KiB for the whole p-block buffer, p > 2. The rooted ones
 * (broadcast, reduce, gather, scatter) first have the ranks agree on the call (ddp_agree.h).
 *
 * No code of its own. Built by DDP_IMPLEMENTATION.
 */
#if defined(DDP_IMPLEMENTATION) && !defined(DDP_ALGORITHMS_IMPLEMENTATION)
#define DDP_ALGORITHMS_IMPLEMENTATION
#endif
#if defined(DDP_ALGORITHMS_IMPLEMENTATION)
#ifndef DDP_RING_IMPLEMENTATION
#define DDP_RING_IMPLEMENTATION
#endif
#ifndef DDP_RECURSIVE_DOUBLING_IMPLEMENTATION
#define DDP_RECURSIVE_DOUBLING_IMPLEMENTATION
#endif
#ifndef DDP_AGREE_IMPLEMENTATION
#define DDP_AGREE_IMPLEMENTATION
#endif
#ifndef DDP_RABENSEIFNER_IMPLEMENTATION
#define DDP_RABENSEIFNER_IMPLEMENTATION
#endif
#ifndef DDP_HIERARCHICAL_IMPLEMENTATION
#define DDP_HIERARCHICAL_IMPLEMENTATION
#endif
#ifndef DDP_TREE_IMPLEMENTATION
#define DDP_TREE_IMPLEMENTATION
#endif
#ifndef DDP_CHAIN_IMPLEMENTATION
#define DDP_CHAIN_IMPLEMENTATION
#endif
#ifndef DDP_LINEAR_IMPLEMENTATION
#define DDP_LINEAR_IMPLEMENTATION
#endif
#ifndef DDP_PAIRWISE_IMPLEMENTATION
#define DDP_PAIRWISE_IMPLEMENTATION
#endif
#ifndef DDP_DETERMINISTIC_IMPLEMENTATION
#define DDP_DETERMINISTIC_IMPLEMENTATION
#endif
#endif
#include "ddp_ring.h"
#include "ddp_recursive_doubling.h"
#include "ddp_agree.h"
#include "ddp_rabenseifner.h"
#include "ddp_hierarchical.h"
#include "ddp_tree.h"
#include "ddp_chain.h"
#include "ddp_linear.h"
#include "ddp_pairwise.h"
#include "ddp_deterministic.h"
