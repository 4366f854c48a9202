"""Data: parallel text in, padded tensor batches out.

corpus.py     read and validate parallel text (local folder, own files, Hugging Face hub)
tokenizer.py  SentencePiece training, caching, encoding, decoding; the special ids
batching.py   token-bucket batch sampler and collate
pipeline.py   prepare_data(cfg): all of the above for one data config, with stats

Imports nothing from models/ or training/.
"""
