"""English word lists shared by indexing, enrichment and querying: one home, so they cannot drift apart."""

# Lucene's English stop set, which is also tantivy's `stopword("english")` list: what the lexical
# analyzers drop, so a query of only these words must match nothing.
_ENGLISH_STOP_LIST = (
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with"
)
ENGLISH_STOP_WORDS = frozenset(_ENGLISH_STOP_LIST.split())

# Interrogatives and auxiliaries: they shape a question but never name what it asks about.
QUESTION_WORDS = frozenset(
    ["what", "which", "who", "whom", "whose", "when", "where", "why", "how", "according", "did", "does", "do", "was", "were", "is", "are", "has", "have", "had", "much", "many", "can", "could", "would", "should", "will", "shall"]
)

# Every English function word (pronouns, prepositions, auxiliaries, quantifiers): not a keyword.
FUNCTION_WORDS = (
    ENGLISH_STOP_WORDS
    | QUESTION_WORDS
    | frozenset(
        ["about", "above", "after", "again", "against", "all", "also", "am", "any", "because", "been", "before", "being", "below", "between", "both", "doing", "down", "during", "each", "few", "from", "further", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "i", "its", "itself", "just", "me", "more", "most", "my", "myself", "nor", "now", "off", "once", "only", "other", "our", "ours", "ourselves", "out", "over", "own", "per", "same", "she", "so", "some", "than", "theirs", "them", "themselves", "those", "through", "too", "under", "until", "up", "very", "via", "we", "while", "within", "without", "you", "your", "yours", "yourself"]
    )
)
