"""Data: parallel text in, padded tensor batches out.

corpus.py     find and stream parallel text in local folders and files; the one UTF-8 line decoder
hub.py        a Hugging Face hub data set's splits, and the probe of the hub
tokenizer.py  SentencePiece training, caching, encoding, decoding; the special ids
sampling.py   subword regularization: a new segmentation per epoch
encoding.py   text to ids on every core, in chunks
store.py      the token store: encoded splits on disk, memory-mapped
batching.py   id sequences kept flat in NumPy arrays, token-bucket batch sampler, batches
loading.py    an epoch's batches collated in order, here or by worker processes
pipeline.py   prepare_data(cfg): the store of one data config, built once, with stats

Imports nothing from models/ or training/.
"""
