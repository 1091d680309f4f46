"""Script models: tiny qwen3moe GGUF files whose greedy (and near-greedy) output is a fixed text, to test what the
server does with a model's output (reasoning, tool calls) end to end.

The model is a bigram machine. Its one layer adds nothing to the residual stream (zero attention output and expert
down projections), so the logits depend only on the last token: token_embd maps each script token to its own unit
vector, output.weight maps that vector to the next script token with a large logit. The script starts after the
token that ends the generation prompt ("\\n" of "<|im_start|>assistant\\n") and ends with <|im_end|>; every other
token also leads to <|im_end|>. Script pieces are extra vocabulary entries (appended to the golden models' 512-token
vocabulary) or the existing special tokens, all distinct, so the machine never loops, except the "endless" script,
which starts again after its last piece: it writes until max_tokens or the context's end. The chat template is a
short Qwen3-style one that shows tools, assistant tool calls and tool results.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

import gguf
from tools.golden.vocab import build_vocab, bytes_to_unicode

N_EMBD = 64
N_HEAD, N_HEAD_KV, HEAD_DIM = 2, 1, 32
N_EXPERT, N_EXPERT_USED, N_FF = 2, 1, 32
LOGIT = 12.0  # per unit of the normalised hidden state: the next token wins by ~96 logits

TOOLS_HEADER = {
    "json": ("For each function call, return a json object with function name and arguments within "
             "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
             "<args-json-object>}\n</tool_call>"),
    "xml": ("For each function call, use this format:\n<tool_call>\n<function=NAME>\n<parameter=NAME>\nVALUE\n"
            "</parameter>\n</function>\n</tool_call>"),
}

TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\n' + HEADER + '<|im_end|>\\n' -}}"
    "{%- elif messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.first -%}"
    "{%- elif message.role == 'user' or message.role == 'system' -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + message.content -}}"
    "{%- if message.tool_calls -%}{%- for tc in message.tool_calls -%}"
    "{%- set f = tc.function -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' -}}"
    "{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' + GEN_SUFFIX -}}{%- endif -%}"
)

# What each script model says, piece by piece (special tokens as themselves).
SCRIPTS = {
    "json": ["<think>", "\nI should ", "call the tool.\n", "</think>", "\n\n", "<tool_call>", "\n{\"name\": ",
             "\"get_weather\"", ", \"arguments\": ", "{\"city\": ", "\"Paris\"}", "}\n", "</tool_call>"],
    # The template opens <think> itself (as thinking models' templates do); the output starts inside it.
    "xml": ["I will use ", "the tool.", "</think>", "\n\n", "<tool_call>", "\n<function=get_weather>\n",
            "<parameter=city>\n", "Paris\n", "</parameter>\n<parameter=days>\n", "3\n", "</parameter>\n",
            "</function>\n", "</tool_call>"],
    # Never ends (a long reply for the chat page's stop button).
    "endless": ["The river ", "runs on ", "and on, ", "past the ", "market. "],
    # Fill-in-the-middle: the vocabulary has Qwen2.5-Coder's FIM tokens and the script follows <|fim_middle|>.
    "fim": ["    return ", "a + b", "\n"],
    # Markdown with HTML in it, for the chat page's rendering.
    "markdown": ["Here is **bold** and `code`", " <img src=x onerror=\"window.pwned=1\">", "\n\n```python\n",
                 "print('<b>hi</b>')\n", "```\n", "done"],
    # A JSON answer (constrained decoding: a schema it fits leaves it as it is).
    "answer": ["{\"city\": ", "\"Paris\"", ", \"days\": ", "3", "}"],
}
FIM_TOKENS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
EXPECTED = {
    "json": {"reasoning": "I should call the tool.", "name": "get_weather", "arguments": {"city": "Paris"}},
    "xml": {"reasoning": "I will use the tool.", "name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
}


def template(kind: str) -> str:
    header = TOOLS_HEADER["xml" if kind == "xml" else "json"]
    header = header.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    suffix = "<think>\\n" if kind == "xml" else ""
    return TEMPLATE.replace("HEADER", "'" + header + "'").replace("GEN_SUFFIX", "'" + suffix + "'")


def write_script_model(path: Path, kind: str) -> Path:
    vocab = build_vocab()
    b2u = bytes_to_unicode()
    spell = lambda text: "".join(b2u[b] for b in text.encode("utf-8"))  # noqa: E731
    tokens = list(vocab.tokens)
    types = list(vocab.token_types)
    index = {t: i for i, t in enumerate(tokens)}

    def token_id(piece: str) -> int:
        if piece in index and types[index[piece]] != 1:  # a special token, spelled as itself
            return index[piece]
        s = spell(piece)
        if s not in index:
            index[s] = len(tokens)
            tokens.append(s)
            types.append(1)
        return index[s]

    if kind == "fim":
        for t in FIM_TOKENS:
            index[t] = len(tokens)
            tokens.append(t)
            types.append(3)
    start = index["<|fim_middle|>"] if kind == "fim" else token_id("\n")
    script = [token_id(p) for p in SCRIPTS[kind]]
    end = index["<|im_end|>"]
    chain = [start] + script
    assert len(set(chain)) == len(chain), "script pieces must be distinct tokens"
    assert len(chain) < N_EMBD - 1
    n_vocab = len(tokens)

    embd = np.zeros((n_vocab, N_EMBD), np.float32)
    embd[:, N_EMBD - 1] = 1.0  # every other token: the "elsewhere" direction
    out = np.zeros((n_vocab, N_EMBD), np.float32)
    for j, t in enumerate(chain):
        embd[t] = 0.0
        embd[t, j] = 1.0
        if j + 1 < len(chain):
            nxt = chain[j + 1]
        else:
            nxt = chain[1] if kind == "endless" else end
        out[nxt, j] = LOGIT
    out[end, N_EMBD - 1] = LOGIT

    rng = np.random.default_rng(5)
    small = lambda *shape: (rng.standard_normal(shape) * 0.02).astype(np.float32)  # noqa: E731
    tensors = {
        "token_embd.weight": embd,
        "blk.0.attn_norm.weight": np.ones(N_EMBD, np.float32),
        "blk.0.attn_q.weight": small(N_HEAD * HEAD_DIM, N_EMBD),
        "blk.0.attn_k.weight": small(N_HEAD_KV * HEAD_DIM, N_EMBD),
        "blk.0.attn_v.weight": small(N_HEAD_KV * HEAD_DIM, N_EMBD),
        "blk.0.attn_q_norm.weight": np.ones(HEAD_DIM, np.float32),
        "blk.0.attn_k_norm.weight": np.ones(HEAD_DIM, np.float32),
        "blk.0.attn_output.weight": np.zeros((N_EMBD, N_HEAD * HEAD_DIM), np.float32),
        "blk.0.ffn_norm.weight": np.ones(N_EMBD, np.float32),
        "blk.0.ffn_gate_inp.weight": small(N_EXPERT, N_EMBD),
        "blk.0.ffn_gate_exps.weight": small(N_EXPERT, N_FF, N_EMBD),
        "blk.0.ffn_up_exps.weight": small(N_EXPERT, N_FF, N_EMBD),
        "blk.0.ffn_down_exps.weight": np.zeros((N_EXPERT, N_EMBD, N_FF), np.float32),
        "output_norm.weight": np.ones(N_EMBD, np.float32),
        "output.weight": out,
    }

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "qwen3moe")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"script-{kind}")
    w.add_block_count(1)
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_expert_feed_forward_length(N_FF)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(vocab.merges)
    w.add_eos_token_id(end)
    w.add_pad_token_id(index["<|endoftext|>"])
    w.add_bos_token_id(index["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(template(kind))
    for name, data in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)
    return path
