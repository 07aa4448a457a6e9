// The MoE layer's test-only reference (moe_reference.cpp): token by token, no permutation, no communication.
#pragma once

#include <vector>

#include "kernels/moe/moe_layer.h"

namespace lcplan::moe {

// Naive single-process reference, token by token (no permutation, no communication), in T = float or double.
// `w` must hold every expert (ep_size 1). Used by the tests as an independent check.
template <class T>
void moe_reference_forward(const MoeConfig& c, const MoeWeights& w, const T* x, int tokens, T* out);

// Its backward, token by token in T precision: dx[tokens x hidden] and the weight grads (shaped like MoeWeights'
// tensors) for dout[tokens x hidden]. Only T = double is instantiated: it is the tests' exact gradient.
template <class T>
struct ReferenceGrads {
  std::vector<T> dx, router, w1, w2, shared_w1, shared_w2, shared_gate;
};
template <class T>
ReferenceGrads<T> moe_reference_backward(const MoeConfig& c, const MoeWeights& w, const T* x, int tokens,
                                         const T* dout);

}  // namespace lcplan::moe
