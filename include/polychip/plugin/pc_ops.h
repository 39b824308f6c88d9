/*
 * polychip plugin ABI — the compute domain's op set.
 *
 * Ops are of medium granularity: enough to express the forward pass of llama/qwen2-family
 * models in about ten kinds of launch, so that a new chip implements tens of functions, while
 * the framework keeps the model graph, the KV cache policy and the scheduler.
 *
 * Every op is launched with pc_backend_iface.op_launch(stream, op, args): the args struct is
 * read during the call only (the plugin copies what it needs); the device memory it points at
 * must stay valid until the op has completed on the stream. Ops are stream-ordered: an op sees
 * the effects of every earlier operation on the same stream.
 *
 * Layout conventions:
 *   - Shapes are written outermost first: [rows, cols] means `cols` contiguous elements per row.
 *   - Activations are F32 unless a member says otherwise. Index arrays are int32.
 *   - Quantized weights are rows of GGUF blocks: a row of k elements occupies
 *     (k / block_elems) * block_bytes bytes; k is a multiple of the block size.
 *
 * Adding an op: an entry in pc_ops.def (the op set as data), its args struct here (beginning
 * with struct_size), its reference kernel and Validate overload in the SDK, a PC_ABI_MINOR bump
 * and a CHANGELOG line. Old plugins answer `supports` with 0.
 */
#ifndef POLYCHIP_PLUGIN_PC_OPS_H_
#define POLYCHIP_PLUGIN_PC_OPS_H_

#include "polychip/plugin/pc_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A device address. Opaque to the host: the host may add byte offsets within one allocation
 * but must never dereference it (on a discrete device it is not a host pointer at all). */
typedef uint64_t pc_devptr_t;

/* The ops, generated from pc_ops.def (one entry per op: id, name, args struct, dtype roles, the
 * ABI minor that added it). EMBEDDING gathers rows of a (possibly quantized) table; RMS_NORM,
 * MATMUL (y = x W^T (+ bias) (+ y), W of any weight dtype), ROPE (normal or NeoX pairing, YaRN),
 * KV_STORE and ATTENTION (paged, GQA, causal), SWIGLU, ADD, CONVERT (dtype conversion), MOE
 * (routed mixture-of-experts feed-forward, 1.3), GEGLU and SCALE (1.4), LORA (one LoRA adapter's
 * low-rank term over a list of rows, 1.8). */
typedef enum pc_op {
#define PC_OP(NAME, name, Name, id, ...) PC_OP_##NAME = id,
#include "polychip/plugin/pc_ops.def"
#undef PC_OP
  PC_OP_COUNT, /* one past the last op of this minor version (ids are appended in order) */
  /* Not an op: widens the type to 32 bits, so that an op id added by a later minor is still a
   * valid value of pc_op_t in a plugin built against this header (C++ forbids loading an enum
   * value outside the range of its enumerators; UBSan reports it). */
  PC_OP_MAX_ENUM_ = 0x7FFFFFFF
} pc_op_t;

/* Shape classes a plugin may distinguish in `supports` (e.g. a fast kernel only for decode). */
typedef enum pc_shape_class {
  PC_SHAPE_ANY = 0,
  PC_SHAPE_DECODE = 1,  /* few rows (one token per sequence) */
  PC_SHAPE_PREFILL = 2, /* many rows */
} pc_shape_class_t;

/* Weight layouts. 0 is the GGUF layout every plugin understands; a plugin that repacks weights
 * at upload (pc_backend_iface.weight_upload) returns its own non-zero tag and recognises it. */
#define PC_LAYOUT_GGUF 0u

typedef struct pc_op_query {
  size_t struct_size;
  pc_op_t op;
  /* Op-specific: EMBEDDING {table}; MATMUL {weight}; KV_STORE and ATTENTION {K cache, V cache}
   * (V's came in 1.6: PC_DTYPE_INVALID from an older host means the same as K's);
   * CONVERT {src, dst}; MOE {gate, up, down, lora A} (1.7: the 4th PC_DTYPE_INVALID without
   * low-rank terms, as an older host sends it); LORA {A, B}; others {F32}. Unused entries are
   * PC_DTYPE_INVALID. */
  pc_dtype_t dtypes[4];
  pc_shape_class_t shape_class;
  /* (1.2) Layout of the EMBEDDING table or the MATMUL weight (of MOE and LORA: a private tag
   * any of their weights has): PC_LAYOUT_GGUF, or a tag this plugin's weight_upload returned.
   * A plugin answers 1 for a non-GGUF tag only if the op reads that layout. Plugins older than
   * 1.2 do not read this member, so the host asks them about PC_LAYOUT_GGUF only. */
  uint32_t layout;
} pc_op_query_t;

/* PC_OP_EMBEDDING. out[i, :] = dequantize(table[ids[i], :]). Also used to gather F32 rows. */
typedef struct pc_embedding_args {
  size_t struct_size;
  pc_devptr_t table;      /* [n_rows, row_len] of table_dtype, in layout table_layout */
  pc_dtype_t table_dtype;
  int64_t n_rows;
  int64_t row_len;
  pc_devptr_t ids;        /* int32 [n_ids], each in [0, n_rows) */
  int64_t n_ids;
  pc_devptr_t out;        /* f32 [n_ids, row_len] */
  /* (1.2) PC_LAYOUT_GGUF, or a tag from this plugin's weight_upload (the table then is a
   * weight uploaded as [n_rows, row_len]): lets a repacked output matrix of a model with tied
   * embeddings serve as its embedding table too, instead of a second copy. Absent (a 1.0/1.1
   * host's shorter struct): PC_LAYOUT_GGUF. Only used when op_supports said yes for it. */
  uint32_t table_layout;
} pc_embedding_args_t;

/* PC_OP_RMS_NORM. out may equal x (in place). */
typedef struct pc_rms_norm_args {
  size_t struct_size;
  pc_devptr_t x;      /* f32 [n_rows, dim] */
  pc_devptr_t weight; /* f32 [dim], or 0 for no scaling */
  pc_devptr_t out;    /* f32 [n_rows, dim] */
  int64_t n_rows;
  int64_t dim;
  float eps;
} pc_rms_norm_args_t;

/* PC_OP_MATMUL. out[i, j] = sum_k x[i, k] * W[j, k] + bias[j] (+ out[i, j] if accumulate). */
typedef struct pc_matmul_args {
  size_t struct_size;
  pc_devptr_t x;        /* f32 [m, k], rows x_stride elements apart */
  pc_devptr_t w;        /* w_dtype [n, k] in layout w_layout */
  pc_dtype_t w_dtype;
  uint32_t w_layout;
  pc_devptr_t bias;     /* f32 [n], or 0 */
  pc_devptr_t out;      /* f32 [m, n], rows out_stride elements apart; must not alias x */
  int64_t m;
  int64_t n;
  int64_t k;
  int64_t x_stride;     /* >= k */
  int64_t out_stride;   /* >= n */
  int32_t accumulate;   /* non-zero: add into out (fuses the residual connection) */
} pc_matmul_args_t;

typedef enum pc_rope_mode {
  PC_ROPE_NORMAL = 0, /* rotate adjacent pairs (x[2i], x[2i+1])        — llama */
  PC_ROPE_NEOX = 2,   /* rotate halves (x[i], x[i + n_rot/2])          — qwen2, gpt-neox */
} pc_rope_mode_t;

/* PC_OP_ROPE, in place. For pair i < n_rot/2 at position p:
 *   theta = p * freq_base^(-2i/n_rot) / freq_factors[i]   (freq_factors absent: 1)
 * with YaRN interpolation between theta*freq_scale and theta when ext_factor != 0, and the
 * rotated values scaled by attn_factor (times YaRN's magnitude correction). Dimensions at or
 * beyond n_rot pass through unchanged. */
typedef struct pc_rope_args {
  size_t struct_size;
  pc_devptr_t x;            /* f32 [n_tokens, n_heads, head_dim] */
  pc_devptr_t positions;    /* int32 [n_tokens] */
  pc_devptr_t freq_factors; /* f32 [n_rot / 2], or 0 */
  int64_t n_tokens;
  int64_t n_heads;
  int64_t head_dim;
  int32_t n_rot;
  pc_rope_mode_t mode;
  float freq_base;
  float freq_scale;  /* 1 / linear scaling factor */
  float ext_factor;  /* YaRN extrapolation mix; 0 disables YaRN */
  float attn_factor; /* magnitude scale, normally 1 */
  float beta_fast;
  float beta_slow;
  int32_t n_ctx_orig; /* training context, for YaRN's correction dims */
} pc_rope_args_t;

/* Paged KV cache layout, shared by KV_STORE and ATTENTION: K and V are separate buffers of
 * [n_blocks, block_size, n_kv_heads, head_dim] elements, K's of cache_dtype and V's of
 * v_cache_dtype (1.6; before 1.6 both were cache_dtype). A slot is
 * block_index * block_size + offset_in_block. The cache types: F32, F16, BF16, and (1.6) the
 * block types Q8_0, Q4_0 (GGUF's layouts) and FP8_E4M3 (pc_common.h). A block type quantizes
 * each (token, KV head) row of head_dim elements on its own (head_dim is then a multiple of 32):
 * the row takes head_dim / 32 blocks, and a row of a slot lies
 * kv_head * RowBytes(dtype, head_dim) bytes into it. KV_STORE quantizes as the SDK's
 * QuantizeRow does (Q8_0: d = amax / 127, q = round(x / d); Q4_0: d = m / -8 where m is the
 * element of largest magnitude, q = min(15, trunc(x / d + 8.5)); FP8_E4M3: the smallest power
 * of two s with amax / s <= 448, codes rounded to nearest even); ATTENTION reads the blocks as
 * they are (an implementation may quantize q as its dot product needs: llama.cpp quantizes q to
 * Q8_0 against a Q8_0 or Q4_0 K; the tolerance of the conformance kit allows it).
 *
 * (1.6) Query dtypes of both ops: {K cache, V cache}. A host older than 1.6 sends dtypes[1] =
 * PC_DTYPE_INVALID, which reads as "the same as dtypes[0]". A plugin answers per pair. */

/* PC_OP_KV_STORE. Writes token t's K/V rows into slot slots[t]; slots[t] < 0 skips the token. */
typedef struct pc_kv_store_args {
  size_t struct_size;
  pc_devptr_t k;       /* f32 [n_tokens, n_kv_heads, head_dim] */
  pc_devptr_t v;       /* f32 [n_tokens, n_kv_heads, head_dim] */
  pc_devptr_t k_cache;
  pc_devptr_t v_cache;
  pc_devptr_t slots;   /* int32 [n_tokens] */
  pc_dtype_t cache_dtype; /* K cache's (and, absent v_cache_dtype, V cache's) */
  int64_t n_tokens;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  /* (1.6) V cache's dtype; cache_dtype is then K's. Absent (an older host's shorter struct):
   * cache_dtype. */
  pc_dtype_t v_cache_dtype;
} pc_kv_store_args_t;

/* PC_OP_ATTENTION. The batch holds n_seqs sequences; sequence s owns query rows
 * [query_start[s], query_start[s+1]) and has seq_lens[s] positions in the cache (its new tokens
 * included, already stored by KV_STORE). Its j-th query row (of n_q) is at position
 * seq_lens[s] - n_q + j and attends causally to positions 0..that position, found through
 * block_tables[s, position / block_size]. Query head h reads KV head h / (n_heads / n_kv_heads).
 * out = softmax(scale * q k^T) v, computed in F32. With window > 0 (1.4, sliding-window
 * attention: Gemma 2/3, Mistral) a query at position i sees only the keys at positions j with
 * i - j < window, i.e. the last `window` positions up to its own. */
typedef struct pc_attention_args {
  size_t struct_size;
  pc_devptr_t q;            /* f32 [n_tokens, n_heads, head_dim] */
  pc_devptr_t k_cache;
  pc_devptr_t v_cache;
  pc_devptr_t out;          /* f32 [n_tokens, n_heads, head_dim] */
  pc_devptr_t query_start;  /* int32 [n_seqs + 1] */
  pc_devptr_t seq_lens;     /* int32 [n_seqs] */
  pc_devptr_t block_tables; /* int32 [n_seqs, max_blocks_per_seq] */
  pc_dtype_t cache_dtype;   /* K cache's (and, absent v_cache_dtype, V cache's) */
  int64_t n_tokens;
  int64_t n_seqs;
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  int64_t max_blocks_per_seq;
  int64_t max_seq_len;      /* upper bound of seq_lens, a sizing hint */
  float scale;              /* usually 1 / sqrt(head_dim) */
  /* (1.4) Keys visible to a query: the last `window` positions up to its own; 0 = all of them
   * (plain causal). Absent (an older host's shorter struct): 0. The host never asks a plugin
   * older than 1.4 for a window (it would ignore the member): such a launch runs on the
   * --op-fallback device or fails. */
  int64_t window;
  /* (1.6) V cache's dtype; cache_dtype is then K's. Absent (an older host's shorter struct):
   * cache_dtype. */
  pc_dtype_t v_cache_dtype;
} pc_attention_args_t;

/* PC_OP_SWIGLU. out[i] = gate[i] / (1 + exp(-gate[i])) * up[i]. out may alias gate or up. */
typedef struct pc_swiglu_args {
  size_t struct_size;
  pc_devptr_t gate; /* f32 [n] */
  pc_devptr_t up;   /* f32 [n] */
  pc_devptr_t out;  /* f32 [n] */
  int64_t n;
} pc_swiglu_args_t;

/* PC_OP_GEGLU (1.4). out[i] = gelu(gate[i]) * up[i], with GELU's tanh approximation
 *   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * (Gemma's feed-forward). out may alias gate or up. */
typedef struct pc_geglu_args {
  size_t struct_size;
  pc_devptr_t gate; /* f32 [n] */
  pc_devptr_t up;   /* f32 [n] */
  pc_devptr_t out;  /* f32 [n] */
  int64_t n;
} pc_geglu_args_t;

/* PC_OP_SCALE (1.4). out[i] = x[i] * scale (Gemma's embeddings times sqrt(n_embd)). out may
 * alias x. */
typedef struct pc_scale_args {
  size_t struct_size;
  pc_devptr_t x;   /* f32 [n] */
  pc_devptr_t out; /* f32 [n] */
  int64_t n;
  float scale;
} pc_scale_args_t;

/* PC_OP_ADD. out[i] = a[i] + b[i]. out may alias a or b. */
typedef struct pc_add_args {
  size_t struct_size;
  pc_devptr_t a;   /* f32 [n] */
  pc_devptr_t b;   /* f32 [n] */
  pc_devptr_t out; /* f32 [n] */
  int64_t n;
} pc_add_args_t;

/* PC_OP_CONVERT. n elements from src (src_dtype) to dst (dst_dtype). Float types convert with
 * round-to-nearest-even; a quantized src is dequantized (dst must then be F32). */
typedef struct pc_convert_args {
  size_t struct_size;
  pc_devptr_t src;
  pc_devptr_t dst;
  pc_dtype_t src_dtype;
  pc_dtype_t dst_dtype;
  int64_t n;
} pc_convert_args_t;

/* PC_OP_MOE (1.3). The routed experts of a mixture-of-experts feed-forward (Qwen3-MoE,
 * Mixtral, OLMoE) for n_tokens rows, routing included. For token t:
 *   p = softmax(logits[t])                       over the n_experts router logits
 *   E = the n_used experts of largest p           (ties: the lower expert index)
 *   w_e = p_e, or p_e / max(sum_{E} p, 2^-14)     when norm_weights
 *   out[t] = sum_{e in E} w_e * down_e(silu(gate_e x[t]) * up_e x[t])   (+ out[t] if accumulate)
 * where gate_e, up_e are rows [e * n_ff, (e + 1) * n_ff) of gate/up and down_e rows
 * [e * n_embd, (e + 1) * n_embd) of down: GGUF's 3-D expert tensors [n_experts, rows, cols]
 * seen as one matrix. Each weight may have its own dtype and layout (a private layout being
 * one this plugin's weight_upload returned for the whole 3-D tensor). An implementation should
 * group the tokens by expert so that each chosen expert's matrices are read once per launch.
 * The query's dtypes are {gate, up, down}; its layout is a private tag any of the three has,
 * else PC_LAYOUT_GGUF. Routing is inside the op so that the host never waits for the router's
 * result. out must not alias x or logits. */
typedef struct pc_moe_args {
  size_t struct_size;
  pc_devptr_t x;        /* f32 [n_tokens, n_embd] */
  pc_devptr_t logits;   /* f32 [n_tokens, n_experts] router logits (x ffn_gate_inp^T) */
  pc_devptr_t gate;     /* gate_dtype [n_experts * n_ff, n_embd] in layout gate_layout */
  pc_dtype_t gate_dtype;
  uint32_t gate_layout;
  pc_devptr_t up;       /* up_dtype [n_experts * n_ff, n_embd] in layout up_layout */
  pc_dtype_t up_dtype;
  uint32_t up_layout;
  pc_devptr_t down;     /* down_dtype [n_experts * n_embd, n_ff] in layout down_layout */
  pc_dtype_t down_dtype;
  uint32_t down_layout;
  pc_devptr_t out;      /* f32 [n_tokens, n_embd] */
  int64_t n_tokens;
  int64_t n_embd;
  int64_t n_ff;         /* rows of one expert's gate/up matrix */
  int64_t n_experts;
  int64_t n_used;       /* experts per token, 1..n_experts */
  int32_t norm_weights; /* non-zero: the chosen experts' weights are divided by their sum */
  int32_t accumulate;   /* non-zero: add into out (fuses the residual connection) */
  /* (1.7) Per-expert low-rank terms: a LoRA adapter of the experts, applied unmerged so that
   * each launch (a run of rows of one adapter) may have its own factor. With them each chosen
   * expert's matrices act as
   *   gate_e + s_gate B_gate_e A_gate_e,  up_e + s_up B_up_e A_up_e,  down_e + s_down ...
   * i.e. gate_e x + s_gate B_gate_e (A_gate_e x) (the same for up, and for down on the product
   * silu(gate) * up), where A_e is rows [e * r, (e + 1) * r) of the stacked A [n_experts * r,
   * cols] and B_e rows [e * rows, (e + 1) * rows) of the stacked B [n_experts * rows, r]: the
   * adapter file's tensors (GGUF dims {cols, r, n_experts} and {r, rows, n_experts}) as they
   * are, in the GGUF layout. Each product rounds its input as MATMUL does against a weight of
   * that type: against a Q8_0 A or B the input is rounded to int8 in blocks of 32 first (the
   * cpu plugin's and llama.cpp's quantized matmuls), against F32/F16/BF16 it is not. A
   * projection whose A (or B) is 0 has no term; all six 0 (an older host's shorter struct, or
   * a launch without an adapter): plain MOE. The query's dtypes[3] is lora_a_dtype for a
   * launch with terms, PC_DTYPE_INVALID without (a plugin older than 1.7 ignores dtypes[3], so
   * the host asks only a 1.7 plugin about terms, and launches them only on one). B's rows are r
   * long, rarely whole Q8_0 blocks, so files keep B in F16 where A is Q8_0: a plugin that says
   * yes to terms takes B in any of F32, F16, BF16 and Q8_0. */
  pc_dtype_t lora_a_dtype;  /* A's of the three: F32, F16, BF16 or Q8_0 */
  pc_dtype_t lora_b_dtype;  /* B's of the three: F32, F16, BF16 or Q8_0 */
  pc_devptr_t gate_lora_a;  /* lora_a_dtype [n_experts * gate_lora_rank, n_embd], or 0 */
  pc_devptr_t gate_lora_b;  /* lora_b_dtype [n_experts * n_ff, gate_lora_rank], or 0 */
  int64_t gate_lora_rank;
  pc_devptr_t up_lora_a;    /* lora_a_dtype [n_experts * up_lora_rank, n_embd], or 0 */
  pc_devptr_t up_lora_b;    /* lora_b_dtype [n_experts * n_ff, up_lora_rank], or 0 */
  int64_t up_lora_rank;
  pc_devptr_t down_lora_a;  /* lora_a_dtype [n_experts * down_lora_rank, n_ff], or 0 */
  pc_devptr_t down_lora_b;  /* lora_b_dtype [n_experts * n_embd, down_lora_rank], or 0 */
  int64_t down_lora_rank;
  float gate_lora_scale;    /* s of each term: alpha / r times the request's scale */
  float up_lora_scale;
  float down_lora_scale;
} pc_moe_args_t;

/* PC_OP_LORA (1.8). One LoRA adapter's low-rank term, added to the listed rows of a batch:
 *   out[rows[i], :] += scale * (x[rows[i], :] A^T) B^T    for i < n_rows
 * (rows 0: rows[i] = i). The term of W' = W + s B A that the host adds after the base matrix's
 * MATMUL; a batch mixing adapters launches it once per adapter (and factor) with that
 * adapter's rows, wherever they are in the batch, instead of a MATMUL, SCALE, MATMUL per run
 * of consecutive rows. A and B are the adapter's matrices as weight_upload laid them out (the
 * same uploads MATMUL reads: a plugin may reuse its matmul kernels). Each product rounds its
 * input as MATMUL does against a weight of that type and layout (against Q8_0: int8 in blocks
 * of 32), so that the op gives what the three launches it replaces give. The rows are distinct
 * (a plugin may add to them in parallel); x and out are not aliased. The query's dtypes are
 * {A, B}; its layout a private tag either has, else PC_LAYOUT_GGUF: a plugin answers for the
 * pairs of types and layouts it reads, and the host launches the three ops instead where it
 * says no (or is older than 1.8). */
typedef struct pc_lora_args {
  size_t struct_size;
  pc_devptr_t x;        /* f32 [m, k] */
  pc_devptr_t out;      /* f32 [m, n] */
  int64_t m;            /* rows of x and out */
  pc_devptr_t rows;     /* int32 [n_rows], each in [0, m), distinct; or 0 for 0..n_rows-1 */
  int64_t n_rows;       /* 0..m */
  int64_t k;
  int64_t n;
  pc_devptr_t a;        /* a_dtype [rank, k] in layout a_layout */
  pc_devptr_t b;        /* b_dtype [n, rank] in layout b_layout */
  pc_dtype_t a_dtype;
  pc_dtype_t b_dtype;
  uint32_t a_layout;
  uint32_t b_layout;
  int64_t rank;
  float scale;          /* s: alpha / rank times the request's scale */
} pc_lora_args_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* POLYCHIP_PLUGIN_PC_OPS_H_ */
