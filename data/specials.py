"""The special token ids, fixed for every tokenizer this project trains (the one place they are defined).

PAD_ID = 0  <pad>   padding, never predicted
UNK_ID = 1  <unk>   rarely used: byte fallback spells unseen characters as UTF-8 bytes
BOS_ID = 2  <s>     starts the decoder input
EOS_ID = 3  </s>    ends source and target sequences
"""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_TOKENS = {"<pad>": PAD_ID, "<unk>": UNK_ID, "<s>": BOS_ID, "</s>": EOS_ID}
