"""gpuconsole: a terminal operations console for GPU servers."""

import warnings

__version__ = "0.1.0"

# asyncssh touches cryptography's DSA classes at import, and cryptography 51 warns that DSA is
# deprecated each time: a dozen lines on stderr before every error and on every start, about
# keys the user cannot act on here (asyncssh still reads DSA keys while cryptography has them).
warnings.filterwarnings("ignore", message="DSA is deprecated", module="asyncssh")
