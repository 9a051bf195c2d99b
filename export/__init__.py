"""Export trained heads for vLLM, SGLang and the Hugging Face Hub, and read engine folders back.
Not torch modules: checkpoint files, key tables and folders. One job per module:

- `rules`: the export rule, both ways: the weights and config.json an engine loads for a headway
  checkpoint (feature scale folded into fc, SGLang's zero fc.bias, feature layer ids in the engine's
  numbering, refusals), and an engine folder back as a headway checkpoint.
- `engine_keys`: per (engine, method) the weights and config keys the engine's loader reads.
- `check`: a folder against its table, every problem named.
- `checkpoint`: a headway checkpoint folder in memory.
- `folders`: `export()` writes a checked folder atomically; `load_exported()` loads one back.
- `model_card`: the README.md of an `hf` export. `serve`: the engine command line for a folder.
"""
