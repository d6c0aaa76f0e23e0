"""dplint's language server (`dplint server`), built on pygls; installed with `pip install 'dplint[server]'`."""
