/* libflow: everything public, for programs that want one include, in the
 * order of the library's layers (HACKING.md).  flow/kernels_cuda.h is not
 * here: it needs the CUDA headers. */
#ifndef FLOW_FLOW_H
#define FLOW_FLOW_H

/* core */
#include <flow/common.h>
#include <flow/error.h>
#include <flow/log.h>
#include <flow/parse.h>
#include <flow/mem.h>
#include <flow/file.h>
#include <flow/checksum.h>
#include <flow/compress.h>
#include <flow/json.h>
#include <flow/version.h>
/* tensor */
#include <flow/tensor.h>
#include <flow/box.h>
#include <flow/rng.h>
/* kernels */
#include <flow/blas.h>
#include <flow/kernels.h>
#include <flow/kernels_ref.h>
/* device */
#include <flow/device.h>
#include <flow/gpu_binding.h>
#include <flow/caching_alloc.h>
/* sbp */
#include <flow/sbp.h>
#include <flow/cluster.h>
#include <flow/boxing.h>
/* ops, graph, models */
#include <flow/graph.h>
#include <flow/ops.h>
#include <flow/signature.h>
#include <flow/model.h>
/* data, ckpt */
#include <flow/tokens.h>
#include <flow/shard.h>
#include <flow/loader.h>
#include <flow/ckpt.h>
/* comm */
#include <flow/world.h>
#include <flow/launch.h>
#include <flow/comm.h>
/* plan */
#include <flow/plan.h>
#include <flow/localize.h>
/* runtime */
#include <flow/boxing_exec.h>
#include <flow/exec.h>
#include <flow/optim.h>
#include <flow/zero.h>
#include <flow/grad_buckets.h>
#include <flow/grad_sync.h>
#include <flow/train.h>
/* bench */
#include <flow/bench.h>
#include <flow/bench_comm.h>

#endif
