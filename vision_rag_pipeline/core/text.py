"""Word lists shared by indexing and querying, one per language."""

# Lucene's English stop set, which is also tantivy's `stopword("english")` list.
_ENGLISH_STOP_LIST = (
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with"
)
ENGLISH_STOP_WORDS = frozenset(_ENGLISH_STOP_LIST.split())
