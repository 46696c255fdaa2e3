/* libflow: everything public, for programs that want one include. */
#ifndef FLOW_FLOW_H
#define FLOW_FLOW_H

#include <flow/common.h>
#include <flow/error.h>
#include <flow/log.h>
#include <flow/parse.h>
#include <flow/mem.h>
#include <flow/file.h>
#include <flow/checksum.h>
#include <flow/compress.h>
#include <flow/tensor.h>
#include <flow/rng.h>
#include <flow/version.h>
#include <flow/blas.h>
#include <flow/kernels.h>
#include <flow/kernels_ref.h>
#include <flow/bench.h>
#include <flow/tokens.h>
#include <flow/shard.h>
#include <flow/loader.h>
#include <flow/graph.h>
#include <flow/ops.h>
#include <flow/exec.h>
#include <flow/model.h>
#include <flow/optim.h>
#include <flow/ckpt.h>
#include <flow/train.h>
#include <flow/zero.h>
#include <flow/localize.h>
#include <flow/sbp.h>
#include <flow/boxing.h>
#include <flow/signature.h>

#endif
