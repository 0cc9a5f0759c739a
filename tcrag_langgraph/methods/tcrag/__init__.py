"""TC-RAG (Turing-Complete RAG): the stack machine of Algorithm 1 (paper appendix 8.6).

``state`` (the stack and its operations), ``actions`` (the action grammar and format repair),
``transitions`` (every rule of the algorithm, pure), ``prompting`` (the system prompt) and ``graph``
(the LangGraph nodes that score, apply a transition and emit its event).
"""
