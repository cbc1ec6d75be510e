// The call config of plus.linear and plus.linear_layernorm (runtime/linear.py's LINEAR_SPEC,
// runtime/linear_layernorm.py's LINEAR_LAYERNORM_SPEC), parsed in one place for the oneDNN
// kernel (onednn_linear.cc) and the few-row GEMV (gemv.cc).
#ifndef PLUS_TVM_NATIVE_LINEAR_CONFIG_H_
#define PLUS_TVM_NATIVE_LINEAR_CONFIG_H_

#include <cstdint>
#include <string>

#include "onednn_common.h"

namespace plus_native {

struct LinearConfig {
  bool kn = false;  // w is [K, N] (else [N, K])
  bool bias = false;
  bool residual = false;
  bool prepack = true;
  bool nan = true;  // ReLU keeps NaN (the Python kernel's semantics; no key for it)
  int64_t parts = 1;  // the weight (and bias) split into this many inputs, concatenated on N
  std::string act = "none";
  Activation activation = Activation::kNone;
  // plus.linear_layernorm
  bool norm = false;
  bool gamma = false;
  bool beta = false;
  bool sum_out = false;
  float eps = 1e-5f;
  bool known = false;   // every item understood (a key and value of the kernel's spec)
  bool native = false;  // the oneDNN kernel takes it (prepacked, one part)

  // x, the parts' weights and biases, the residual: the linear's own inputs
  int linear_inputs() const { return static_cast<int>(1 + parts * (1 + bias) + residual); }
  // and plus.linear_layernorm's gamma and beta after them
  int inputs() const { return linear_inputs() + gamma + beta; }
};

// ``norm``: plus.linear_layernorm's keys (no parts, no activation), else plus.linear's.
inline LinearConfig ParseLinearConfig(const std::string& text, bool norm) {
  LinearConfig cfg;
  cfg.norm = norm;
  bool ok = ForEachItem(text, [&](const std::string& key, const std::string& value) {
    if (key == "w") {
      cfg.kn = value == "kn";
      return value == "kn" || value == "nk";
    }
    if (key == "bias") return ParseFlag(value, &cfg.bias);
    if (key == "residual") return ParseFlag(value, &cfg.residual);
    if (key == "prepack") return ParseFlag(value, &cfg.prepack);
    if (!norm && key == "parts") return ParseInts(value, &cfg.parts, 1);
    if (!norm && key == "act") {
      cfg.act = value;
      return ActivationOf(value, &cfg.activation);
    }
    if (norm && key == "gamma") return ParseFlag(value, &cfg.gamma);
    if (norm && key == "beta") return ParseFlag(value, &cfg.beta);
    if (norm && key == "sum_out") return ParseFlag(value, &cfg.sum_out);
    if (norm && key == "eps") return ParseFloat(value, &cfg.eps);
    return false;  // a key of a newer contract: the Python side knows it
  });
  cfg.known = ok;
  cfg.native = ok && cfg.prepack && cfg.parts == 1;
  return cfg;
}

}  // namespace plus_native

#endif  // PLUS_TVM_NATIVE_LINEAR_CONFIG_H_
