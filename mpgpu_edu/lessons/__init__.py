"""What the notebooks run: small SPMD demos and figures for one lesson each.

``l00`` welcome and devices, ``l01`` communication. A notebook never defines library code:
the programs it launches and the figures it draws that belong to no other module live here,
each a plain function that tests call directly.
"""
