"""The incident bundle: one tar.gz for a ticket about one host (``B`` on the host screen,
`gpuconsole bundle HOST`). ``gather`` collects on the host, ``contents`` lays out the files,
``archive`` writes them, ``make`` puts it together, ``inputs`` builds what a bundle is about
from the console's store or from a recording."""
