"""Export trained heads for vLLM, SGLang, llama.cpp and the Hugging Face Hub, and read engine folders back.
Not torch modules: checkpoint files, key tables and folders. One job per module:

- `rules`: the export rule, both ways: the weights and config.json an engine loads for a headway
  checkpoint (feature scale folded into fc, SGLang's zero fc.bias, feature layer ids in both engines'
  numbering, no d2t/t2d with the full vocabulary, refusals), and an engine folder back as a headway checkpoint.
- `engine_keys`: per (engine, method) the weights and config keys the engine's loader reads.
- `releases`: the engine release ranges (vLLM <= 0.11, 0.12-0.32, 0.33; SGLang 0.5.23) and what each
  cannot load (Medusa on vLLM 0.33, reduced-vocabulary Medusa on vLLM 0.12-0.32).
- `check`: a folder against its table and release, every problem named.
- `checkpoint`: a headway checkpoint folder in memory, and its target's dtype.
- `folders`: `export()` writes a checked folder atomically; `load_exported()` loads one back.
- `llamacpp`: `export_llamacpp()` writes an EAGLE-3 draft GGUF (llama.cpp's converter) and target GGUFs.
- `model_card`: the README.md of an `hf` export. `serve`: the engine command line for a folder.
"""
