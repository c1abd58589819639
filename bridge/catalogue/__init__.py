"""What the bridge knows by name, written once: backbone architectures and their capabilities, the Clef
releases, dtypes and media kinds, as frozen tables every other room derives its sets, choices and texts from.

May import: head.
"""
