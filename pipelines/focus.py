"""What a question asks for, read from its question words, and which source sentences give that.

The extractive answer (no model configured) shows source sentences; the closest in meaning to the
question is often the document's opening, which names the topic ("本文说明……的判断标准、常见原因和
处理措施。") and answers nothing. A question's form says what kind of sentence answers it: "what should
I do" / 怎么办 wants the measures, "how often" / 多久 the interval, "why" / 原因 the causes, "what does
E-004 mean" / 什么意思 the meaning, "how do I" / 如何 the steps. These are properties of English and
Chinese, not of one knowledge base: the cue words below were written from the languages' question
forms and from how manuals state measures, intervals, causes and meanings, not fitted to a set.
"""

from __future__ import annotations

import re

MEASURES, STEPS, INTERVAL, CAUSE, MEANING = "measures", "steps", "interval", "cause", "meaning"

# Order matters: the first focus whose question form matches wins ("how often should I grease" is an
# interval, not steps; "what should I do" is measures, not steps).
_QUESTION_FORMS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (INTERVAL, re.compile(
        r"\bhow (?:often|frequently)\b|\bat what intervals?\b|\bhow many (?:hours|days|weeks|months|years)\b"
        r"|\bintervals?\b|\bhow long (?:between|until|before)\b"
        r"|多久|多长时间|隔多|周期|频率|几个月|多少(?:小时|天|个月)")),
    (MEANING, re.compile(
        r"\bwhat (?:does|do|did) .{1,60}\b(?:mean|stand for|indicate|signify)\b|\bmeaning of\b|\bstands? for\b"
        r"|什么意思|含义|意思是|代表什么|表示什么|指什么|是指")),
    (CAUSE, re.compile(
        r"\bwhy\b|\bwhat (?:causes?|caused|makes?)\b|\bcauses? of\b|\breasons? (?:for|why)\b"
        r"|为什么|为何|原因|什么导致|怎么会|为啥")),
    (MEASURES, re.compile(
        r"\bwhat (?:should|can|must|do|shall) (?:i|we|you|one) (?:do|check|try)\b|\bwhat to do\b"
        r"|\bhow (?:do|can|should|would) (?:i|we|you) (?:fix|solve|repair|resolve|troubleshoot|handle|deal with|"
        r"prevent|stop|clear|reset|cure|avoid)\b|\bhow to (?:fix|solve|repair|resolve|troubleshoot|handle|prevent|"
        r"stop|clear|avoid)\b|\b(?:remed(?:y|ies)|fix|solution)\b"
        r"|怎么办|咋办|如何处理|怎么处理|怎样处理|如何解决|怎么解决|怎样解决|如何排除|怎么排除|怎么修|如何应对|怎么应对|该怎么做|应该怎么做")),
    (STEPS, re.compile(
        r"^\W*how (?:do|can|should|would|could) (?:i|we|you)\b|\bhow to\b|\bsteps? (?:to|for)\b|\bprocedure\b"
        r"|如何|怎么|怎样|步骤|流程")),
)

# Sentences that state what the question's focus asks for. Measures and steps: an instruction (an
# action verb opening it, or a label such as "处理：" / "Remedy:"), or what must or should be done.
_ACTION_VERBS = (
    "check|clean|replace|reduce|measure|contact|tighten|install|remove|set|tap|select|press|turn|open|close|"
    "disconnect|connect|increase|decrease|swap|wait|let|call|use|add|apply|adjust|inspect|lubricate|regrease|"
    "grease|wipe|stop|restart|reset|enable|disable|choose|enter|go|drag|swipe|touch|make sure|ensure|avoid|keep|"
    "order|switch|run|lower|raise|improve|verify|test|update|clear|unplug|plug|follow|refer|see|hold|release")
_OPENING = r"^[\s\-*+>|]*(?:\d+[.)、]\s*)?(?:\*\*)?"
_FOCUS_SENTENCES: dict[str, re.Pattern[str]] = {
    MEASURES: re.compile(
        _OPENING + r"(?:(?:if|when|to|for|from|on|in) [^,，:：]{1,60}[,，:：]\s*)?(?:" + _ACTION_VERBS + r")\b"
        r"|\b(?:remed(?:y|ies)|solution|action|measures?)\s*[:：]|\b(?:must|should|need to|have to) (?:be )?\w+"
        r"|(?:处理|措施|解决|对策|方法|建议)\s*[:：]|(?:检查|清洁|清理|更换|测量|降低|减轻|加装|联系|停机|调整|设置|按|紧固|提高|"
        r"断开|核对|补充|改用|增加|确认|排查)|应|需|必须|不得|禁止|不要", re.IGNORECASE),
    INTERVAL: re.compile(
        r"\bevery\b|\beach \d|\bintervals?\b|\bonce (?:a|per|every)\b|\b(?:daily|weekly|monthly|yearly|annually|"
        r"quarterly|hourly)\b|\d[\d,.]*\s*(?:operating\s+)?(?:hours?|h|days?|weeks?|months?|years?)\b"
        r"|每|周期|间隔|\d[\d,.]*\s*(?:小时|天|周|个月|月|年)", re.IGNORECASE),
    CAUSE: re.compile(
        r"\bbecause\b|\bdue to\b|\bcaused? (?:by)?\b|\bcauses\b|\breasons?\b|\bresults? (?:of|from)\b|"
        r"\bresulting from\b|\bleads? to\b|原因|由于|因为|导致|引起|造成", re.IGNORECASE),
    MEANING: re.compile(
        r"\bmeans?\b|\bindicates?\b|\brefers? to\b|\bstands? for\b|\bis defined as\b|\bsignals?\b"
        r"|表示|意思|含义|是指|指的是|说明", re.IGNORECASE),
}
_FOCUS_SENTENCES[STEPS] = _FOCUS_SENTENCES[MEASURES]

# A sentence about the document itself ("This guide describes…", "本文说明…") names the topic and
# answers no question about it.
_ABOUT_THE_DOCUMENT = re.compile(
    r"^[\s\-*]*(?:this|the following) (?:document|guide|page|article|manual|section|chapter|table|schedule|policy|"
    r"procedure|instruction|leaflet|sheet|faq)s? (?:\w+ ){0,2}(?:describes?|explains?|covers?|lists?|applies|"
    r"provides?|contains?|gives?|summari[sz]es|sets? out|is about|answers)\b"
    r"|^[\s\-*]*本(?:文|指南|手册|表|文档|文件|章|节|规范|说明书|政策|规程|作业指导书?|资料)", re.IGNORECASE)


def question_focus(question: str) -> str | None:
    """``measures``, ``steps``, ``interval``, ``cause``, ``meaning``, or None (no form that says)."""
    text = " ".join((question or "").lower().split())
    return next((focus for focus, form in _QUESTION_FORMS if form.search(text)), None)


def gives(focus: str | None, sentence: str) -> bool:
    """Whether ``sentence`` states what a question of ``focus`` asks for."""
    return focus is not None and bool(_FOCUS_SENTENCES[focus].search(sentence))


def about_the_document(sentence: str) -> bool:
    """Whether ``sentence`` describes its document rather than saying something about the topic."""
    return bool(_ABOUT_THE_DOCUMENT.search(sentence))
